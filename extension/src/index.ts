// JupyterLab plugin: puts the workbench sidebar in the left area, with commands to open it
// and to open the full memory review panel (Panel, in a console of its own).
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, showErrorMessage } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';

import { WorkbenchApi } from './api';
import { WorkbenchPanel } from './panel';

const ICON = new LabIcon({
  name: 'jupyter-workbench-lab:icon',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><path class="jp-icon3" fill="#616161" d="M4 4h16v11H8l-4 4zM7 8v2h10V8zm0 3v2h7v-2z"/></svg>'
});

// The review app runs in a kernel and reaches the memories through this server's API.
const REVIEW_CODE = `import panel as pn
import workbench
from workbench.panels.review import ReviewApp
from workbench.panels.source import RestSource

pn.extension(inline=True)
wb = workbench.connect()
ReviewApp(RestSource(wb.url, wb.token)).panel()`;

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-workbench-lab:plugin',
  description: 'The workbench sidebar: agent sessions, their hands, and memory review.',
  autoStart: true,
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const { commands, shell } = app;
    const api = new WorkbenchApi(app.serviceManager.serverSettings);
    const panel = new WorkbenchPanel(api, () => void commands.execute('workbench:open-review'));
    panel.title.icon = ICON;
    panel.title.caption = 'Workbench';
    shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, 'jupyter-workbench-lab');

    commands.addCommand('workbench:open', {
      label: 'Open the Workbench sidebar',
      execute: () => shell.activateById(panel.id)
    });
    commands.addCommand('workbench:open-review', {
      label: 'Open the memory review panel',
      execute: async () => {
        try {
          // The default kernel, started at once: no kernel dialog in the way.
          const name = app.serviceManager.kernelspecs.specs?.default || 'python3';
          const console: any = await commands.execute('console:create', {
            name: 'Memory review',
            activate: true,
            kernelPreference: { name, autoStartDefault: true }
          });
          await console.sessionContext.ready;
          console.console.inject(REVIEW_CODE);
        } catch (err) {
          void showErrorMessage('Workbench', `Could not open the review panel: ${err}`);
        }
      }
    });
    for (const command of ['workbench:open', 'workbench:open-review']) {
      palette?.addItem({ command, category: 'Workbench' });
    }
  }
};

export default plugin;
