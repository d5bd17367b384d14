// JupyterLab plugin: puts the workbench sidebar in the left area and a command to open it.
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { LabIcon } from '@jupyterlab/ui-components';

import { WorkbenchApi } from './api';
import { WorkbenchPanel } from './panel';

const ICON = new LabIcon({
  name: 'jupyter-workbench-lab:icon',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><path class="jp-icon3" fill="#616161" d="M4 4h16v11H8l-4 4zM7 8v2h10V8zm0 3v2h7v-2z"/></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-workbench-lab:plugin',
  description: 'The workbench sidebar: agent sessions, their hands, and memory review.',
  autoStart: true,
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (app: JupyterFrontEnd, palette: ICommandPalette | null, restorer: ILayoutRestorer | null) => {
    const api = new WorkbenchApi(app.serviceManager.serverSettings);
    const reviewUrl = URLExt.join(api.settings.baseUrl, 'workbench/review');
    const panel = new WorkbenchPanel(api, reviewUrl);
    panel.title.icon = ICON;
    panel.title.caption = 'Workbench';
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, 'jupyter-workbench-lab');

    app.commands.addCommand('workbench:open', {
      label: 'Open the Workbench sidebar',
      execute: () => app.shell.activateById(panel.id)
    });
    palette?.addItem({ command: 'workbench:open', category: 'Workbench' });
  }
};

export default plugin;
