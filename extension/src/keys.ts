// Keyboard use of the sidebar: the palette commands and their shortcuts (documented in
// docs/jupyterlab.md), and arrow-key navigation through the sessions list.
import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';

import { WorkbenchPanel } from './panel';

/** The sidebar's commands, their palette labels and default shortcuts. */
export const COMMANDS = {
  open: 'workbench:open',
  focus: 'workbench:focus-input',
  newSession: 'workbench:new-session',
  send: 'workbench:send',
  interrupt: 'workbench:interrupt',
  retry: 'workbench:retry',
  review: 'workbench:open-review'
} as const;

/** Add the chat commands, their shortcuts and palette items for `panel`. */
export function addChatCommands(
  app: JupyterFrontEnd,
  panel: WorkbenchPanel,
  palette: ICommandPalette | null
): void {
  const { commands, shell } = app;
  const show = () => {
    shell.activateById(panel.id);
  };
  commands.addCommand(COMMANDS.focus, {
    label: 'Focus the Workbench message box',
    execute: () => {
      show();
      panel.focusInput();
    }
  });
  commands.addCommand(COMMANDS.newSession, {
    label: 'New Workbench session',
    execute: async () => {
      show();
      await panel.newSession();
    }
  });
  commands.addCommand(COMMANDS.send, {
    label: 'Send the Workbench message',
    isEnabled: () => !panel.isRunning,
    execute: () => panel.send()
  });
  commands.addCommand(COMMANDS.interrupt, {
    label: 'Stop the running Workbench turn',
    isEnabled: () => panel.isRunning,
    execute: () => panel.interrupt()
  });
  commands.addCommand(COMMANDS.retry, {
    label: 'Retry the last Workbench message',
    isEnabled: () => !!panel.session && !panel.isRunning,
    execute: () => panel.retry()
  });
  const bindings: [string, string[], string][] = [
    [COMMANDS.focus, ['Accel Shift U'], 'body'],
    [COMMANDS.newSession, ['Accel Shift Y'], 'body'],
    [COMMANDS.send, ['Accel Enter'], '.jp-wb-panel .jp-wb-input'],
    [COMMANDS.interrupt, ['Accel Shift X'], 'body']
  ];
  for (const [command, keys, selector] of bindings) {
    commands.addKeyBinding({ command, keys, selector });
  }
  for (const command of [COMMANDS.focus, COMMANDS.newSession, COMMANDS.interrupt, COMMANDS.retry]) {
    palette?.addItem({ command, category: 'Workbench' });
  }
}

/**
 * Keyboard navigation of a listbox of `li[role=option]`: Up/Down/Home/End move the focus (one item
 * is in the tab order at a time), Enter or Space opens the focused item.
 */
export function listKeys(list: HTMLElement, open: (li: HTMLElement) => void): void {
  list.addEventListener('keydown', e => {
    const items = [...list.querySelectorAll<HTMLElement>('li[role="option"]')];
    const at = items.indexOf(document.activeElement as HTMLElement);
    if (!items.length || at < 0) {
      return;
    }
    let next = at;
    if (e.key === 'ArrowDown') {
      next = Math.min(at + 1, items.length - 1);
    } else if (e.key === 'ArrowUp') {
      next = Math.max(at - 1, 0);
    } else if (e.key === 'Home') {
      next = 0;
    } else if (e.key === 'End') {
      next = items.length - 1;
    } else if (e.key === 'Enter' || e.key === ' ') {
      e.preventDefault();
      open(items[at]);
      return;
    } else {
      return;
    }
    e.preventDefault();
    for (const li of items) {
      li.setAttribute('tabindex', li === items[next] ? '0' : '-1');
    }
    items[next].focus();
  });
}
