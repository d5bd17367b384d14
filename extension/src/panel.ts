// The workbench sidebar: sessions, the selected session's chat and hands, and the Memories tab.
import {
  launchIcon,
  LabIcon,
  notebookIcon,
  refreshIcon,
  stopIcon
} from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import {
  ApiError,
  IAttachment,
  IEvent,
  IHands,
  ISession,
  StreamMessage,
  WorkbenchApi
} from './api';
import { ChatLog, unsandboxed } from './chat';
import { handsText } from './chatarea';
import { PendingContext } from './context';
import { ago, h, marked } from './dom';
import { FilesView, IAttached } from './files';
import { EvalsView } from './evals';
import { MemoriesView } from './memories';
import { ChatRenderer, IRenderContext } from './render';
import { listKeys } from './keys';
import { askEdited, markUserMessage, selection, SessionControls, usageText } from './sessions';

const PAGE = 50; // chats per page of the list
const POLL = 200; // changed chats one poll takes; more, and the list starts over from its first page

/** Where a search found a row (the list shows search hits while there is search text); null for a plain row. */
function hit(s: ISession): { seq: number; snippet: string } | null {
  const { seq, snippet } = s as ISession & { seq?: unknown; snippet?: unknown };
  return typeof snippet === 'string' && snippet && typeof seq === 'number'
    ? { seq, snippet }
    : null;
}

/** The latest updated_at of rows, or `since` if none is later (ISO strings in UTC compare as times). */
function latest(rows: ISession[], since: string): string {
  return rows.reduce((m, s) => (s.updated_at > m ? s.updated_at : m), since);
}

/** A compact button of the session's header: an icon, its name for screen readers and as a tooltip. */
function iconButton(
  icon: LabIcon,
  name: string,
  title: string,
  onclick: () => void
): HTMLButtonElement {
  return h(
    'button',
    { class: 'jp-wb-button jp-wb-icon-button', 'aria-label': name, title, onclick },
    icon.element({ tag: 'span', className: 'jp-wb-icon' })
  );
}

// Committed events after which the hands' status is worth fetching again.
const HANDS_EVENTS = new Set([
  'hands_started',
  'hands_restarted',
  'hands_died',
  'hands_stopped',
  'tool_result'
]);

export class WorkbenchPanel extends Widget {
  private api: WorkbenchApi;
  private log: ChatLog;
  private memories: MemoriesView;
  private evals: EvalsView;
  readonly files: FilesView;
  private controls: SessionControls;
  private usageLabel = h(
    'span',
    { class: 'jp-wb-usage', 'aria-label': 'Tokens and cost of this session' },
    ''
  );
  private current: ISession | null = null;
  private drafts = new Map<string, string>(); // session id -> what was typed for it, while another is selected
  private creating: Promise<void> | null = null; // a new session being made: what is sent meanwhile waits for it
  private ws: WebSocket | null = null;
  private streamOpen: Promise<void> = Promise.resolve();
  private running = false;
  private timer = 0;
  private lastHands: IHands = {} as IHands;

  private list = h('ul', {
    class: 'jp-wb-sessions',
    role: 'listbox',
    'aria-label': 'Sessions (arrow keys move, Enter opens)'
  });
  // The chats shown, newest first: the first page, then each page "Load more" fetched; the poll
  // asks only for what changed since `since` (the latest updated_at seen), never the whole list.
  private rows: ISession[] = [];
  private delegated: ISession[] = []; // delegated sessions, shown under their parents
  private nextCursor: string | null = null;
  private since = '';
  private moreButton = h(
    'button',
    { class: 'jp-wb-more jp-mod-styled', onclick: () => void this.loadMore() },
    'Load more'
  );
  private heading = h('div', { class: 'jp-wb-title' }, 'No session selected');
  private handsLabel = h('span', { class: 'jp-wb-hands-label', role: 'status' }, '');
  private restartButton = iconButton(
    refreshIcon,
    'Restart hands',
    'Restart hands: replace the kernel with a fresh one',
    () => void this.restartHands()
  );
  private interruptButton = iconButton(
    stopIcon,
    'Interrupt',
    'Interrupt: stop the running turn (Esc)',
    () => void this.interrupt()
  );
  /** Set by the plugin: opens an eval run's report in the main area (evalreport.ts). */
  openEvalReport: ((run: string) => void) | null = null;
  /** Set by the plugin: opens a session's chat in a main-area tab (chatarea.ts). */
  openChatTab: ((id: string) => void) | null = null;
  private chatTabButton = iconButton(
    launchIcon,
    'Open the chat in the main area',
    'Open this chat in a main-area tab, where plots and code have room',
    () => this.current && this.openChatTab?.(this.current.id)
  );
  /** Rename, archive and delete for the selected session: beside its title, not inside the list's options
   * (an option holding buttons is a nested interactive control, which screen readers cannot reach). */
  private sessionActions = h('span', { class: 'jp-wb-session-actions' });
  /** Set by the plugin: saves a session's notebook beside the user's files and opens it. */
  openNotebook: ((id: string, title: string) => Promise<void>) | null = null;
  private notebookButton = iconButton(
    notebookIcon,
    'Open as notebook',
    "Open as notebook: the session's code and outputs as a new notebook",
    () => void this.exportNotebook()
  );
  // The key hints are the box's tooltip: a placeholder holding them was cut off at the sidebar's width.
  private input = h('textarea', {
    class: 'jp-wb-input',
    rows: 2,
    'aria-label': 'Message to the agent',
    title: 'Enter sends, Shift+Enter starts a new line, Esc stops the running turn',
    placeholder: 'Message the agent…'
  });
  // Send while no turn runs; Stop (the interrupt) in its place while one does.
  private sendButton = h(
    'button',
    {
      class: 'jp-wb-button jp-mod-accept jp-wb-send',
      onclick: () => (this.running ? this.interrupt() : this.send())
    },
    'Send'
  );
  /** Notebook context waiting to go with the next message (context.ts). */
  private context = new PendingContext();
  private error = h('div', { class: 'jp-wb-banner', hidden: true });
  private chatTab = h('section', { class: 'jp-wb-tab' });
  private tabButtons: HTMLButtonElement[] = [];

  constructor(api: WorkbenchApi, openReview: () => void, ctx: IRenderContext = {}) {
    super();
    this.api = api;
    const renderer = new ChatRenderer(ctx);
    this.log = new ChatLog(renderer, (text, attachments) => void this.retry(text, attachments));
    this.id = 'jp-workbench';
    this.addClass('jp-wb-panel');
    this.memories = new MemoriesView(api, openReview, {
      render: renderer,
      open: (id, seq) => void this.openSession(id, seq)
    });
    this.files = new FilesView(api, rec => this.attached(rec));
    this.evals = new EvalsView(
      api,
      run => this.openEvalReport?.(run),
      () => this.isVisible
    );
    this.controls = new SessionControls(
      api,
      () => void this.refresh(),
      err => this.showError(err)
    );
    this.input.addEventListener('keydown', e => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        if (!this.sendButton.disabled && !this.running) {
          void this.send(); // Enter does what the Send button does, and nothing while a turn runs
        }
      }
    });
    // Esc anywhere in the sidebar stops the running turn (as the Stop button does).
    this.node.addEventListener('keydown', e => {
      if (e.key === 'Escape' && this.running && this.current) {
        e.preventDefault();
        e.stopPropagation();
        void this.interrupt();
      }
    });
    listKeys(this.list, li => {
      const s = [...this.rows, ...this.delegated].find(r => r.id === li.dataset.sessionId);
      if (s) {
        void this.select(s);
      }
    });
    this.chatTab.append(
      h(
        'div',
        { class: 'jp-wb-section-head' },
        h('span', {}, 'Sessions'),
        h(
          'button',
          { class: 'jp-wb-button', title: 'Start a new session', onclick: () => this.newSession() },
          '+ New session'
        )
      ),
      this.controls.node,
      this.list,
      // Two short lines: the title with its actions, then the hands' status with theirs.
      h(
        'div',
        { class: 'jp-wb-session-head' },
        h(
          'div',
          { class: 'jp-wb-head-row' },
          this.heading,
          this.sessionActions,
          this.chatTabButton
        ),
        h(
          'div',
          { class: 'jp-wb-hands' },
          this.handsLabel,
          this.usageLabel,
          this.restartButton,
          this.interruptButton,
          this.notebookButton
        )
      ),
      this.log.node,
      this.context.node,
      h('div', { class: 'jp-wb-composer' }, this.input, this.sendButton)
    );
    const tabs = h('nav', { class: 'jp-wb-tabs', role: 'tablist' });
    for (const [name, el] of [
      ['Chat', this.chatTab],
      ['Files', this.files.node],
      ['Memories', this.memories.node],
      ['Evals', this.evals.node]
    ] as const) {
      const button = h(
        'button',
        { class: 'jp-wb-tabbutton', role: 'tab', onclick: () => this.showTab(button, el) },
        name
      );
      this.tabButtons.push(button);
      tabs.append(button);
    }
    this.node.append(
      tabs,
      this.error,
      this.chatTab,
      this.files.node,
      this.memories.node,
      this.evals.node
    );
    this.showTab(this.tabButtons[0], this.chatTab);
    this.updateButtons();
  }

  protected onAfterAttach(): void {
    void this.controls.loadModels();
    void this.refresh().then(() => this.restoreSelection());
    // The session list also changes from notebooks and the CLI: keep it fresh while shown.
    this.timer = window.setInterval(() => this.isVisible && void this.poll(), 5000);
  }

  protected onBeforeDetach(): void {
    window.clearInterval(this.timer);
  }

  dispose(): void {
    window.clearInterval(this.timer);
    this.evals.dispose();
    this.closeStream();
    this.log.dispose();
    super.dispose();
  }

  /** A sidebar restored closed drew its chat while hidden (no height to scroll): at the end once shown. */
  protected onAfterShow(): void {
    this.log.follow();
  }

  protected onResize(): void {
    this.log.follow();
  }

  private showTab(button: HTMLButtonElement, el: HTMLElement): void {
    for (const b of this.tabButtons) {
      b.classList.toggle('jp-mod-active', b === button);
      b.setAttribute('aria-selected', String(b === button));
    }
    this.chatTab.hidden = el !== this.chatTab;
    this.memories.node.hidden = el !== this.memories.node;
    this.files.node.hidden = el !== this.files.node;
    this.evals.node.hidden = el !== this.evals.node;
    this.evals.setShown(el === this.evals.node);
    if (el === this.memories.node) {
      void this.memories.refresh();
    }
    if (el === this.files.node) {
      void this.files.refresh();
    }
  }

  /** Run an API call, showing its error (one line) in the banner. */
  private async guard<T>(fn: () => Promise<T>): Promise<T | undefined> {
    try {
      const result = await fn();
      this.error.hidden = true;
      return result;
    } catch (err) {
      const status = err instanceof ApiError ? err.status : 0;
      this.error.textContent =
        status === 404 && !this.current
          ? 'The workbench server extension is not running on this server.'
          : String((err as Error).message || err);
      this.error.hidden = false;
      return undefined;
    }
  }

  private showError(err: unknown): void {
    this.error.textContent = String((err as Error)?.message || err);
    this.error.hidden = false;
  }

  /** The session selected before a reload, selected again (if it still exists). */
  private async restoreSelection(): Promise<void> {
    const id = selection.load();
    if (!id || this.current) {
      return;
    }
    try {
      const session = await this.controls.sapi.session(id);
      if (!this.current) {
        await this.select(session); // unless a session was opened meanwhile (a link to one, say)
      }
    } catch {
      selection.save(null); // deleted meanwhile
    }
  }

  /** Show the first page of chats again (newest first), forgetting the pages loaded after it. */
  async refresh(): Promise<void> {
    const archived = this.controls.archived;
    const page = await this.guard(
      async () =>
        (await this.controls.search()) ??
        this.api.sessionsPage({ kind: 'chat', order: '-created', limit: PAGE, archived } as any)
    );
    if (!page) {
      return;
    }
    this.rows = page.sessions;
    this.nextCursor = page.next;
    this.since = latest(this.rows, '');
    await this.loadChildren();
    this.render();
  }

  /** The delegated children of the chats shown (the newest ones), drawn under their parents. */
  private async loadChildren(changed = false): Promise<boolean> {
    const since = changed ? latest(this.delegated, '') : '';
    const page = await this.guard(() =>
      this.api.sessionsPage(
        since
          ? { kind: 'delegate', order: 'updated', updated_after: since, limit: POLL }
          : { kind: 'delegate', order: '-updated', limit: POLL }
      )
    );
    if (!page || (since && !page.sessions.length)) {
      return false;
    }
    const byId = new Map((since ? this.delegated : []).map(s => [s.id, s] as const));
    for (const s of page.sessions) {
      byId.set(s.id, s);
    }
    this.delegated = [...byId.values()];
    return true;
  }

  /** The next page of older chats, after the last one shown. */
  async loadMore(): Promise<void> {
    if (!this.nextCursor) {
      return;
    }
    const cursor = this.nextCursor;
    const page = await this.guard(() =>
      this.api.sessionsPage({
        kind: 'chat',
        order: '-created',
        limit: PAGE,
        cursor,
        archived: this.controls.archived
      } as any)
    );
    if (!page || cursor !== this.nextCursor) {
      return;
    }
    const shown = new Set(this.rows.map(s => s.id));
    this.rows.push(...page.sessions.filter(s => !shown.has(s.id)));
    this.nextCursor = page.next;
    this.since = latest(page.sessions, this.since);
    this.render();
  }

  /** Bring the list up to date with only the chats that changed since the last look. */
  async poll(): Promise<void> {
    if (!this.since || this.controls.searching) {
      return this.refresh();
    }
    const page = await this.guard(() =>
      this.api.sessionsPage({
        kind: 'chat',
        order: 'updated',
        updated_after: this.since,
        limit: POLL,
        archived: this.controls.archived
      } as any)
    );
    if (!page) {
      return;
    }
    if (page.next) {
      return this.refresh(); // more changed than one poll carries: start from the first page again
    }
    const kidsChanged = await this.loadChildren(true);
    if (!page.sessions.length) {
      if (kidsChanged) {
        this.render();
      }
      return;
    }
    const byId = new Map(this.rows.map(s => [s.id, s] as const));
    const oldest = this.rows[this.rows.length - 1];
    for (const s of page.sessions) {
      // a chat older than every one shown belongs to a page not loaded yet: "Load more" brings it
      if (byId.has(s.id) || !this.nextCursor || !oldest || s.created_at >= oldest.created_at) {
        byId.set(s.id, s);
      }
    }
    this.rows = [...byId.values()].sort((a, b) =>
      a.created_at === b.created_at ? (a.id < b.id ? 1 : -1) : a.created_at < b.created_at ? 1 : -1
    );
    this.since = latest(page.sessions, this.since);
    this.render();
  }

  private render(): void {
    const shown = new Set(this.rows.map(s => s.id));
    const kids = this.delegated.filter(c => !shown.has(c.id));
    for (const c of kids) {
      shown.add(c.id);
    }
    const chats = sessionTree([
      ...this.rows,
      ...kids.filter(c => c.parent_id && shown.has(c.parent_id))
    ]);
    // A keyboard user's focus survives a redraw (the poll redraws every few seconds): the new row of
    // the focused session takes it back, with the list's one tab stop.
    const active = document.activeElement;
    const focusId =
      active instanceof HTMLElement && this.list.contains(active)
        ? active.closest<HTMLElement>('li.jp-wb-session')?.dataset.sessionId
        : undefined;
    this.list.replaceChildren(
      ...chats.map(({ session: s, depth, children }) =>
        h(
          'li',
          {
            class: `jp-wb-session${depth ? ' jp-wb-child' : ''}${s.id === this.current?.id ? ' jp-mod-selected' : ''}`,
            role: 'option',
            'data-session-id': s.id,
            'data-parent-id': s.parent_id || undefined,
            'data-depth': String(depth),
            'aria-selected': String(s.id === this.current?.id),
            tabindex: s.id === this.current?.id ? '0' : '-1',
            title: s.id,
            onclick: () => (hit(s) ? this.openAt(s, hit(s)!.seq) : this.select(s))
          },
          h('span', { class: `jp-wb-dot${s.running ? ' jp-mod-running' : ''}` }),
          h('span', { class: 'jp-wb-session-title' }, (depth ? '↳ ' : '') + (s.title || s.id)),
          h(
            'span',
            { class: 'jp-wb-meta' },
            `${s.model} · ${ago(s.updated_at)}` + (children ? ` · ${children} delegated` : '')
          ),
          hit(s) &&
            h(
              'span',
              {
                class: 'jp-wb-snippet',
                title: 'Where it matched: click to open the session there'
              },
              ...marked(hit(s)!.snippet, this.controls.searching)
            )
        )
      )
    );
    if (!this.rows.length) {
      this.list.append(
        h(
          'li',
          { class: 'jp-wb-empty', role: 'presentation' },
          'No sessions yet. Start one with + New session.'
        )
      );
    } else if (!this.list.querySelector('[tabindex="0"]')) {
      this.list.querySelector('.jp-wb-session')?.setAttribute('tabindex', '0'); // Tab reaches the list
    }
    const refocus = focusId
      ? [...this.list.querySelectorAll<HTMLElement>('li.jp-wb-session')].find(
          li => li.dataset.sessionId === focusId
        )
      : undefined;
    if (refocus) {
      for (const li of this.list.querySelectorAll<HTMLElement>('li.jp-wb-session')) {
        li.setAttribute('tabindex', li === refocus ? '0' : '-1');
      }
      refocus.focus();
    }
    if (this.nextCursor) {
      this.list.append(h('li', { class: 'jp-wb-more-row', role: 'presentation' }, this.moreButton));
    }
  }

  /** After a row's rename, archive or delete: the list again, and the heading (or no selection). */
  private async afterChange(s: ISession, deleted: boolean): Promise<void> {
    if (this.current?.id === s.id) {
      if (deleted) {
        this.closeStream();
        this.current = null;
        this.sessionActions.replaceChildren();
        selection.save(null);
        this.heading.textContent = this.heading.title = 'No session selected';
        this.usageLabel.textContent = '';
        this.files.setSession(null);
        this.log.clear();
        this.updateButtons();
      } else {
        const row = await this.guard(() => this.controls.sapi.session(s.id));
        if (row) {
          this.current = row;
          this.showActions(row);
          this.heading.textContent = this.heading.title = `${row.title || row.id} · ${row.model}`;
          this.files.setSession(row.id, row.title || '');
        }
      }
    }
    await this.refresh();
  }

  /** The selected session's rename, archive and delete buttons, beside its title. */
  private showActions(s: ISession): void {
    this.sessionActions.replaceChildren(
      this.controls.rowActions(s, deleted => void this.afterChange(s, deleted))
    );
  }

  /** Edit and resend: fork the session before message `seq`, select the fork, send the edited text there. */
  private async editAndResend(seq: number, text: string): Promise<void> {
    const id = this.current?.id;
    const edited = id ? await askEdited(text) : null;
    if (!id || edited === null) {
      return;
    }
    const fork = await this.guard(() => this.controls.sapi.fork(id, Math.max(seq - 1, 1)));
    if (fork) {
      await this.select(fork);
      this.input.value = edited;
      await this.send();
      await this.refresh();
    }
  }

  private async showUsage(): Promise<void> {
    const id = this.current?.id;
    if (!id) {
      return;
    }
    const usage = await this.guard(() => this.controls.sapi.usage(id));
    if (usage && id === this.current?.id) {
      this.usageLabel.textContent = this.usageLabel.title = usage.total.calls
        ? usageText(usage)
        : '';
    }
    const row = await this.guard(() => this.controls.sapi.session(id));
    if (row && id === this.current?.id) {
      this.heading.textContent = this.heading.title = `${row.title || row.id} · ${row.model}`; // the first message may have named it
      this.files.setSession(row.id, row.title || '');
    }
  }

  /** The session shown, if any (attach actions put files into its workspace). */
  get session(): ISession | null {
    return this.current;
  }

  /** Whether the session shown has a turn running (Stop in place of Send). */
  get isRunning(): boolean {
    return !!this.current && this.running;
  }

  /** Put the keyboard focus in the composer. */
  focusInput(): void {
    this.input.focus();
  }

  /** A new session, selected; `firstMessage` (about to be sent) ranks the memories it is given. A message sent
   * while it is being made goes to it (send waits), not to the session selected before. */
  async newSession(firstMessage?: string): Promise<void> {
    const work = this.createAndSelect(firstMessage);
    this.creating = work;
    try {
      await work;
    } finally {
      if (this.creating === work) {
        this.creating = null;
      }
    }
  }

  private async createAndSelect(firstMessage?: string): Promise<void> {
    const before = this.current;
    const draft = this.input.value; // the selected session's draft when a new session was asked for
    const body: Record<string, unknown> = { ...this.controls.newSessionBody() };
    if (firstMessage) {
      body.first_message = firstMessage;
    }
    const session = await this.guard(() => this.api.createSession(body as any));
    if (session) {
      const typed = this.input.value;
      const selecting = this.select(session); // keeps the composer as the draft of the session before
      if (typed !== draft) {
        // typed while the session was being made: the new session's; the one before keeps its draft as it was
        this.input.value = typed;
        if (before && before.id !== session.id) {
          this.drafts.set(before.id, draft);
        }
      }
      await selecting;
      await this.poll();
      this.input.focus();
    }
  }

  async select(session: ISession): Promise<void> {
    this.closeStream();
    const before = this.current;
    if (before && before.id !== session.id) {
      // a draft belongs to its session: kept for when it is selected again, not carried into another one
      // (what is typed with no session selected goes with the session it starts)
      this.drafts.set(before.id, this.input.value);
      this.input.value = this.drafts.get(session.id) ?? '';
      this.drafts.delete(session.id);
    }
    this.current = session;
    this.showActions(session);
    selection.save(session.id);
    this.usageLabel.textContent = '';
    void this.showUsage();
    this.running = session.running;
    this.heading.textContent =
      this.heading.title = `${session.title || session.id} · ${session.model}`;
    this.log.clear();
    for (const li of this.list.querySelectorAll<HTMLElement>('li.jp-wb-session')) {
      const selected = li.getAttribute('data-session-id') === session.id;
      li.classList.toggle('jp-mod-selected', selected);
      li.setAttribute('aria-selected', String(selected));
      li.setAttribute('tabindex', selected ? '0' : '-1');
    }
    this.openStream();
    this.updateButtons();
    this.files.setSession(session.id, session.title || '');
    await this.updateHands();
  }

  /** Select `session` with its chat opened at event `seq` (0: at its end, as selecting it does). */
  async openAt(session: ISession, seq: number): Promise<void> {
    if (session.id !== this.current?.id) {
      await this.select(session);
    }
    this.showTab(this.tabButtons[0], this.chatTab);
    this.log.focus(seq);
  }

  /** Show the Evals tab: the runs with their progress. */
  showEvals(): void {
    this.showTab(this.tabButtons[3], this.evals.node);
  }

  /** Open the session `id` at event `seq` (a memory's source, from the review panel). */
  async openSession(id: string, seq: number): Promise<void> {
    const session = await this.guard(() => this.controls.sapi.session(id));
    if (session) {
      await this.openAt(session, seq);
    }
  }

  /** A file was attached: tell the agent in the next message (a line before what is typed). */
  attached(rec: IAttached): void {
    const line = `[attached to your workspace: ${rec.path} (${rec.kind}, ${rec.bytes} bytes)]`;
    this.input.value = this.input.value ? `${line}\n${this.input.value}` : `${line}\n`;
  }

  private openStream(): void {
    const session = this.current;
    if (!session) {
      return;
    }
    const ws = this.api.stream(session.id, this.log.lastSeq, m => this.onStream(m));
    this.streamOpen = new Promise(resolve => {
      ws.addEventListener('open', () => resolve());
      ws.addEventListener('close', () => resolve());
    });
    // Reconnect after a drop: `after` makes sure nothing is missed or drawn twice.
    ws.onclose = () => {
      if (this.ws === ws && !this.isDisposed) {
        window.setTimeout(() => this.ws === ws && this.openStream(), 1000);
      }
    };
    this.ws = ws;
  }

  private closeStream(): void {
    const ws = this.ws;
    this.ws = null;
    ws?.close();
  }

  private onStream(m: StreamMessage): void {
    if (m.kind === 'delta') {
      this.log.delta(m.event);
      return;
    }
    if (m.kind === 'output') {
      this.log.output(m);
      if (m.state === 'running' && m.hands !== this.handsLabel.dataset.state) {
        this.showHands({ ...this.lastHands, state: m.hands }); // e.g. busy while the call runs
      }
      return;
    }
    const ev: IEvent = m.event;
    this.log.event(ev);
    if (ev.type === 'user_message') {
      this.running = true;
      markUserMessage(this.log.node, ev, (seq, text) => void this.editAndResend(seq, text));
    } else if (ev.type === 'turn_ended') {
      this.running = false;
      void this.poll();
      void this.showUsage();
    }
    if (HANDS_EVENTS.has(ev.type)) {
      void this.updateHands();
    }
    if (ev.type === 'tool_result' || ev.type === 'file_attached') {
      this.files.changed();
    }
    this.updateButtons();
  }

  private async updateHands(): Promise<void> {
    const id = this.current?.id;
    if (!id) {
      return;
    }
    const hands = await this.guard(() => this.api.hands(id));
    if (hands && id === this.current?.id) {
      this.showHands(hands);
    }
  }

  private showHands(hands: IHands): void {
    this.lastHands = hands;
    this.handsLabel.textContent = this.handsLabel.title = handsText(hands);
    this.handsLabel.classList.toggle('jp-wb-warn', unsandboxed(hands.backend) !== '');
    this.handsLabel.dataset.generation = String(hands.generation ?? '');
    this.handsLabel.dataset.state = String(hands.state ?? '');
  }

  /** Take notebook context into the composer (sent with the next message); `text` fills an empty composer. */
  addContext(att: IAttachment, text?: string): void {
    this.context.add(att);
    if (text && !this.input.value.trim()) {
      this.input.value = text;
    }
    this.focusInput();
  }

  /** Send the composer's text as the next user message (nothing while a turn runs), with the composer's
   * notebook context, or with `attachments` when given. */
  async send(
    text = this.input.value.trim(),
    fromComposer = true,
    attachments?: IAttachment[]
  ): Promise<void> {
    if (!text) {
      return;
    }
    if (this.creating) {
      // + New session was pressed: the message is the new session's; if it could not be made (the banner says
      // why), the text stays in the composer rather than going to the session selected before
      const was = this.current;
      await this.creating;
      if (this.current === was) {
        return;
      }
    }
    if (!this.current) {
      await this.newSession(text);
    }
    const id = this.current?.id;
    if (!id) {
      return;
    }
    // Busy from now on; the stream's turn_ended (which may beat the POST's answer) ends it.
    this.running = true;
    this.log.focus(0); // what the reader opened the session at gives way to the new turn
    this.updateButtons();
    // Live deltas are not stored: subscribe before the turn starts, or its streaming is missed.
    await this.streamOpen;
    const context = attachments ?? (fromComposer ? this.context.attachments : []);
    if (await this.guard(() => this.api.send(id, text, context))) {
      // The answer may come after the turn's events, when a draft is being typed or more context taken:
      // only what was sent leaves the composer.
      if (fromComposer && this.input.value.trim() === text) {
        this.input.value = '';
      }
      this.context.remove(context);
    } else {
      // Refused (e.g. 409: a turn started elsewhere is running): what runs is the server's to say,
      // so Stop stays available while a turn still runs.
      await this.syncRunning(id);
    }
  }

  /** Retry a failed turn: send its user message again, with its notebook context, as a new message (the log
   * is append-only). */
  async retry(text?: string, attachments?: IAttachment[]): Promise<void> {
    const again = text ?? this.log.lastUserText;
    if (again && !this.running) {
      await this.send(again, false, attachments ?? (text ? [] : this.log.lastUserAttachments));
    }
  }

  /** Ask the server whether the session's turn runs, and show its buttons accordingly. */
  private async syncRunning(id: string): Promise<void> {
    try {
      const s = await this.api.request<ISession>(`sessions/${encodeURIComponent(id)}`);
      if (id === this.current?.id) {
        this.running = !!s.running;
      }
    } catch {
      this.running = false;
    }
    this.updateButtons();
  }

  /** Stop the running turn (Stop, Interrupt, Esc). */
  async interrupt(): Promise<void> {
    const id = this.current?.id;
    if (id) {
      await this.guard(() => this.api.interrupt(id));
    }
  }

  private async restartHands(): Promise<void> {
    const id = this.current?.id;
    if (!id) {
      return;
    }
    this.restartButton.disabled = true;
    this.handsLabel.textContent = 'hands restarting…';
    const hands = await this.guard(() => this.api.restartHands(id));
    if (hands) {
      this.showHands(hands);
    } else {
      await this.updateHands();
    }
    this.updateButtons();
  }

  /** The session shown, as a notebook opened in JupyterLab (the plugin saves and opens it). */
  async exportNotebook(): Promise<void> {
    const s = this.current;
    if (!s || !this.openNotebook) {
      return;
    }
    this.notebookButton.disabled = true;
    try {
      await this.guard(() => this.openNotebook!(s.id, s.title || s.id));
    } finally {
      this.updateButtons();
    }
  }

  private updateButtons(): void {
    const selected = !!this.current;
    this.notebookButton.disabled = !selected || !this.openNotebook;
    this.restartButton.disabled = !selected;
    this.interruptButton.disabled = !selected || !this.running;
    this.chatTabButton.disabled = !selected || !this.openChatTab;
    const stop = selected && this.running;
    this.sendButton.textContent = stop ? 'Stop' : 'Send';
    this.sendButton.title = stop ? 'Stop the running turn (Esc)' : 'Send the message (Enter)';
    this.sendButton.classList.toggle('jp-mod-accept', !stop);
    this.sendButton.classList.toggle('jp-wb-danger', stop);
    this.sendButton.disabled = this.running && !selected;
    this.node.classList.toggle('jp-mod-running', stop);
  }
}

/** One row of the sessions tree: a session, how deep it is, how many children it has. */
export interface ITreeRow {
  session: ISession;
  depth: number;
  children: number;
}

/**
 * Sessions as a tree in list order: each session followed by the sessions it delegated to (their
 * `parent_id`), oldest child first. A child whose parent is not listed is shown at the top level;
 * a cycle (which the log cannot hold, but the data is not trusted) cannot loop.
 */
export function sessionTree(sessions: ISession[]): ITreeRow[] {
  const ids = new Set(sessions.map(s => s.id));
  const kids = new Map<string, ISession[]>();
  for (const s of sessions) {
    if (s.parent_id && ids.has(s.parent_id) && s.parent_id !== s.id) {
      const list = kids.get(s.parent_id) || [];
      list.unshift(s);
      kids.set(s.parent_id, list);
    }
  }
  // oldest child first whatever order the listing came in (a poll's merge may move a busy child up):
  // by creation time, then id, as the server orders them
  const key = (s: ISession): string => `${String((s as any).created_at ?? '')}\u0000${s.id}`;
  for (const list of kids.values()) {
    list.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
  }
  const rows: ITreeRow[] = [];
  const seen = new Set<string>();
  const visit = (s: ISession, depth: number): void => {
    if (seen.has(s.id)) {
      return;
    }
    seen.add(s.id);
    const children = kids.get(s.id) || [];
    rows.push({ session: s, depth, children: children.length });
    for (const c of children) {
      visit(c, depth + 1);
    }
  };
  for (const s of sessions) {
    if (!s.parent_id || !ids.has(s.parent_id) || s.parent_id === s.id) {
      visit(s, 0);
    }
  }
  for (const s of sessions) {
    visit(s, 0); // anything only reachable through a cycle
  }
  return rows;
}
