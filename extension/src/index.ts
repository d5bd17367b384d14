// JupyterLab plugin: puts the workbench sidebar in the left area, with commands to open it,
// to open the memory review in the main area (review.ts) and to attach files, notebook cells
// and selections to the selected session's workspace (files.ts).
import {
  ILayoutRestorer,
  IRouter,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  InputDialog,
  MainAreaWidget,
  Notification,
  showErrorMessage,
  WidgetTracker
} from '@jupyterlab/apputils';
import { IEditorLanguageRegistry } from '@jupyterlab/codemirror';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { LabIcon } from '@jupyterlab/ui-components';

import { WorkbenchApi } from './api';
import { OPEN_CHAT_TAB, SessionChatView } from './chatarea';
import { addContextCommands } from './context';
import { EvalReportView, OPEN_EVAL_REPORT } from './evalreport';
import { AttachKind, fromBase64 } from './files';
import { addChatCommands } from './keys';
import { WorkbenchPanel } from './panel';
import { ChatRenderer } from './render';
import { ReviewPanel } from './review';

const ICON = new LabIcon({
  name: 'jupyter-workbench-lab:icon',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><path class="jp-icon3" fill="#616161" d="M4 4h16v11H8l-4 4zM7 8v2h10V8zm0 3v2h7v-2z"/></svg>'
});

// The query parameters of a link that opens a session at an event (workbench/memory/panels/source.py writes them).
const SESSION_PARAM = 'workbench-session';
const SEQ_PARAM = 'workbench-seq';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-workbench-lab:plugin',
  description: 'The workbench sidebar: agent sessions, their hands, and memory review.',
  autoStart: true,
  // The chat renders with JupyterLab's own rendermime and inserts code into the active notebook.
  // A tool card's code is highlighted with CodeMirror's languages, as a notebook cell is.
  optional: [
    ICommandPalette,
    ILayoutRestorer,
    IRenderMimeRegistry,
    INotebookTracker,
    IEditorLanguageRegistry,
    IRouter
  ],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    rendermime: IRenderMimeRegistry | null,
    notebooks: INotebookTracker | null,
    languages: IEditorLanguageRegistry | null,
    router: IRouter | null
  ) => {
    const { commands, shell } = app;
    const api = new WorkbenchApi(app.serviceManager.serverSettings);
    const panel = new WorkbenchPanel(api, () => void commands.execute('workbench:open-review'), {
      rendermime,
      languages,
      notebooks,
      activate: id => shell.activateById(id)
    });
    // Open as notebook: the session's notebook saved as a new file in the Jupyter root (never over
    // another: a number is added), then opened like any notebook.
    panel.openNotebook = async (id: string, title: string) => {
      const nb = await api.notebook(id);
      const contents = app.serviceManager.contents;
      const stem =
        `workbench-${title}`
          .replace(/[^\p{L}\p{N}._ -]+/gu, '-')
          .replace(/\s+/g, '-')
          .slice(0, 80) || `workbench-${id}`;
      let path = `${stem}.ipynb`;
      for (let n = 2; ; n++) {
        try {
          await contents.get(path, { content: false });
          path = `${stem}-${n}.ipynb`;
        } catch {
          break; // no file of that name: ours to write
        }
      }
      await contents.save(path, { type: 'notebook', format: 'json', content: nb });
      await commands.execute('docmanager:open', { path });
    };
    panel.title.icon = ICON;
    panel.title.caption = 'Workbench';
    shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, 'jupyter-workbench-lab');

    commands.addCommand('workbench:open', {
      label: 'Open the Workbench sidebar',
      execute: () => shell.activateById(panel.id)
    });
    commands.addCommand('workbench:open-session', {
      label: 'Open a workbench session at an event',
      caption: 'Select the session in the Workbench sidebar, its chat at the event (args: id, seq)',
      execute: async args => {
        shell.activateById(panel.id);
        await panel.openSession(String(args.id ?? ''), Number(args.seq ?? 0) || 0);
      }
    });
    // A link from outside JupyterLab (the Panel review app's sources): /lab?workbench-session=ID&workbench-seq=N
    // opens that session at that event; the parameters then leave the address bar, so a reload does not do it again.
    commands.addCommand('workbench:open-session-link', {
      execute: () => {
        const url = new URL(window.location.href);
        const id = url.searchParams.get(SESSION_PARAM);
        const seq = Number(url.searchParams.get(SEQ_PARAM)) || 0;
        url.searchParams.delete(SESSION_PARAM);
        url.searchParams.delete(SEQ_PARAM);
        window.history.replaceState(window.history.state, '', url.toString());
        return id ? commands.execute('workbench:open-session', { id, seq }) : undefined;
      }
    });
    router?.register({
      command: 'workbench:open-session-link',
      pattern: new RegExp(`[?&]${SESSION_PARAM}=`)
    });
    // A session's chat in a main-area tab (chatarea.ts): one tab per session, restored on reload.
    const chatTabs = new WidgetTracker<MainAreaWidget<SessionChatView>>({
      namespace: 'workbench-chat'
    });
    commands.addCommand(OPEN_CHAT_TAB, {
      label: args =>
        args.id ? 'Open the chat in the main area' : 'Open the Workbench chat in the main area',
      caption:
        "Open a session's chat as a tab in the main area (args: id; none: the sidebar's session)",
      isEnabled: args => !!(args.id || panel.session),
      execute: args => {
        const id = String(args.id || panel.session?.id || '');
        if (!id) {
          return;
        }
        const open = chatTabs.find(w => w.content.sessionId === id);
        if (open) {
          shell.activateById(open.id);
          return open;
        }
        const view = new SessionChatView(api, id, {
          rendermime,
          languages,
          notebooks,
          activate: wid => shell.activateById(wid)
        });
        const tab = new MainAreaWidget({ content: view });
        tab.id = `jp-workbench-chat-${id.replace(/[^A-Za-z0-9_-]/g, '_')}`;
        tab.addClass('jp-wb-chattab');
        tab.title.label = id;
        tab.title.icon = ICON;
        tab.title.closable = true;
        view.onTitle = title => {
          tab.title.label = title;
          tab.title.caption = `Workbench: ${title}`;
          void chatTabs.save(tab);
        };
        void chatTabs.add(tab);
        shell.add(tab, 'main');
        shell.activateById(tab.id);
        return tab;
      }
    });
    void restorer?.restore(chatTabs, {
      command: OPEN_CHAT_TAB,
      args: w => ({ id: w.content.sessionId }),
      name: w => w.content.sessionId
    });
    panel.openChatTab = id => void commands.execute(OPEN_CHAT_TAB, { id });
    // Right-click on a session in the sidebar's list: open that session's chat in the main area. The row is read at
    // the right-click (this listener runs before JupyterLab's, which opens the menu): the list is drawn anew when its
    // sessions change, and a row replaced while the menu is open is no longer in the page, where
    // app.contextMenuHitTest stops before reaching it (it walks up only while a node has a parent)
    let contextSession: string | undefined;
    panel.node.addEventListener(
      'contextmenu',
      event => {
        const target = event.target instanceof Element ? event.target : null;
        contextSession =
          target?.closest<HTMLElement>('li.jp-wb-session')?.dataset.sessionId || undefined;
      },
      true
    );
    commands.addCommand('workbench:open-chat-tab-at', {
      label: 'Open the chat in the main area',
      caption: 'Open the session under the pointer as a chat tab in the main area',
      execute: () =>
        contextSession ? commands.execute(OPEN_CHAT_TAB, { id: contextSession }) : undefined
    });
    app.contextMenu.addItem({
      command: 'workbench:open-chat-tab-at',
      selector: '#jp-workbench .jp-wb-session',
      rank: 10
    });
    // An eval run's report in a main-area tab (evalreport.ts): one tab per run, restored on reload.
    const evalTabs = new WidgetTracker<MainAreaWidget<EvalReportView>>({
      namespace: 'workbench-eval-report'
    });
    /** The run to open when the command is given none: picked from the server's runs, newest first. */
    const pickRun = async (): Promise<string> => {
      let runs: string[] = [];
      try {
        runs = (await api.evalRuns()).map(r => r.run).reverse();
      } catch (err) {
        void showErrorMessage(
          'Workbench',
          `Could not list the eval runs: ${(err as Error).message || err}`
        );
        return '';
      }
      if (!runs.length) {
        void showErrorMessage(
          'Workbench',
          "There is no eval run in this server's log yet: start one with wb.eval(...) or workbench eval."
        );
        return '';
      }
      const answer = await InputDialog.getItem({
        title: 'Open the report of an eval run',
        label: 'Run',
        items: runs,
        current: 0
      });
      return answer.button.accept ? String(answer.value ?? '') : '';
    };
    commands.addCommand(OPEN_EVAL_REPORT, {
      label: args => (args.run ? `Open the report of eval run ${args.run}` : 'Open an eval report'),
      caption:
        "Open an eval run's report in the main area: pass rates, the comparison, the task × model grid and each attempt's transcript (args: run)",
      execute: async args => {
        const run = String(args.run || '') || (await pickRun());
        if (!run) {
          return;
        }
        const open = evalTabs.find(w => w.content.runId === run);
        if (open) {
          shell.activateById(open.id);
          return open;
        }
        const view = new EvalReportView(api, run, {
          rendermime,
          languages,
          notebooks,
          activate: wid => shell.activateById(wid)
        });
        view.openSession = id => void commands.execute('workbench:open-session', { id, seq: 0 });
        const tab = new MainAreaWidget({ content: view });
        // an id of the run alone: every other character spelled out, so two runs never share a tab's id
        tab.id = `jp-workbench-eval-${run.replace(
          /[^A-Za-z0-9]/g,
          c => `_${c.charCodeAt(0).toString(16).padStart(4, '0')}`
        )}`;
        tab.addClass('jp-wb-evaltab');
        tab.title.label = `Eval ${run}`;
        tab.title.caption = `Workbench: the report of eval run ${run}`;
        tab.title.icon = ICON;
        tab.title.closable = true;
        void evalTabs.add(tab);
        shell.add(tab, 'main');
        shell.activateById(tab.id);
        return tab;
      }
    });
    void restorer?.restore(evalTabs, {
      command: OPEN_EVAL_REPORT,
      args: w => ({ run: w.content.runId }),
      name: w => w.content.runId
    });
    panel.openEvalReport = run => void commands.execute(OPEN_EVAL_REPORT, { run });
    commands.addCommand('workbench:show-evals', {
      label: 'Show the eval runs in the Workbench sidebar',
      caption:
        'The Evals tab of the sidebar: runs in progress with their progress, and every finished run',
      execute: () => {
        shell.activateById(panel.id);
        panel.showEvals();
      }
    });

    let review: MainAreaWidget<ReviewPanel> | null = null;
    commands.addCommand('workbench:open-review', {
      label: 'Open the memory review panel',
      caption: 'Every memory, its provenance and history, and the review actions, in the main area',
      execute: () => {
        if (!review || review.isDisposed) {
          review = new MainAreaWidget({
            content: new ReviewPanel(api, {
              render: new ChatRenderer({
                rendermime,
                languages,
                notebooks,
                activate: id => shell.activateById(id)
              }),
              open: (id, seq) => void commands.execute('workbench:open-session', { id, seq }),
              user: app.serviceManager.user
            })
          });
          review.id = 'jp-workbench-review-area';
          review.title.label = 'Memory review';
          review.title.icon = ICON;
          review.title.closable = true;
        }
        if (!review.isAttached) {
          shell.add(review, 'main');
        }
        shell.activateById(review.id);
      }
    });

    /** Upload to the sidebar's selected session, and say how it went. */
    const attach = async (
      path: string,
      data: Uint8Array | string,
      kind: AttachKind,
      name: string
    ) => {
      if (!panel.session) {
        void showErrorMessage(
          'Workbench',
          'Select a session in the Workbench sidebar first, then attach.'
        );
        return;
      }
      try {
        const rec = await panel.files.attach(path, data, kind, name);
        Notification.success(
          `Attached ${rec.path} to “${panel.session.title || panel.session.id}”`,
          {
            autoClose: 4000
          }
        );
      } catch (err) {
        void showErrorMessage(
          'Workbench',
          `Could not attach ${name}: ${(err as Error).message || err}`
        );
      }
    };

    commands.addCommand('workbench:attach-file', {
      label: 'Attach to the Workbench session',
      caption: "Copy the selected files into the selected session's workspace",
      execute: async () => {
        const browser: any = Array.from(shell.widgets('left')).find(w => w.id === 'filebrowser');
        const items: any[] = browser?.selectedItems ? Array.from(browser.selectedItems()) : [];
        const files = items.filter(i => i.type !== 'directory');
        if (!files.length) {
          void showErrorMessage(
            'Workbench',
            'Select one or more files in the file browser to attach.'
          );
          return;
        }
        for (const item of files) {
          const model = await app.serviceManager.contents.get(item.path, {
            content: true,
            format: 'base64'
          });
          await attach(model.name, fromBase64(String(model.content)), 'file', model.name);
        }
      }
    });
    app.contextMenu.addItem({
      command: 'workbench:attach-file',
      selector: '.jp-DirListing-item[data-isdir="false"]',
      rank: 60
    });

    commands.addCommand('workbench:attach-cell', {
      label: 'Attach the cell (or its selection) to the Workbench session',
      caption:
        "Copy the active notebook cell's source, or the text selected in it, into the session's workspace",
      execute: async () => {
        const nb: any = shell.currentWidget;
        const cell = nb?.content?.activeCell;
        if (!cell) {
          void showErrorMessage('Workbench', 'Open a notebook and select a cell to attach.');
          return;
        }
        const source: string = cell.model.sharedModel.getSource();
        const editor = cell.editor;
        let text = source;
        let kind: AttachKind = 'cell';
        const sel = editor?.getSelection?.();
        if (sel && (sel.start.line !== sel.end.line || sel.start.column !== sel.end.column)) {
          const a = editor.getOffsetAt(sel.start);
          const b = editor.getOffsetAt(sel.end);
          text = source.slice(Math.min(a, b), Math.max(a, b));
          kind = 'selection';
        }
        const index = (nb.content.activeCellIndex ?? 0) + 1;
        const notebook = String(nb.context?.path || 'notebook')
          .split('/')
          .pop()!
          .replace(/\.ipynb$/, '');
        const ext = cell.model.type === 'markdown' ? 'md' : 'py';
        const path = `${notebook}-${kind}-${index}.${ext}`;
        await attach(path, text, kind, path);
      }
    });
    app.contextMenu.addItem({
      command: 'workbench:attach-cell',
      selector: '.jp-Notebook .jp-Cell',
      rank: 60
    });

    for (const command of [
      'workbench:open',
      'workbench:open-review',
      OPEN_CHAT_TAB,
      OPEN_EVAL_REPORT,
      'workbench:show-evals',
      'workbench:attach-file',
      'workbench:attach-cell'
    ]) {
      palette?.addItem({ command, category: 'Workbench' });
    }
    addChatCommands(app, panel, palette);
    addContextCommands(app, panel, notebooks, palette);
  }
};

export default plugin;
