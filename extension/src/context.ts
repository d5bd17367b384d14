// The notebook as context (docs/jupyterlab.md, "The notebook as context"): cells of the active notebook,
// or the whole notebook, sent with a message as an attachment (docs/api.md, "Notebook context"); the chip
// that shows what was sent; and Replace, which puts the agent's code into the cell a fix was asked for.
import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { ToolbarButton } from '@jupyterlab/ui-components';

import { IAttachedCell, IAttachedOutput, IAttachment } from './api';
import { h, stripAnsi } from './dom';

/** Characters of sources and outputs one attachment takes at most; the cells after it are left out (said so). */
export const BUDGET = 200000;
/** Attachments the composer holds at most (the oldest goes): within the server's 1,000,000 characters a message. */
const PENDING = 4;
/** Characters of one output's text kept (its end: where an error or a result is). */
const OUTPUT_CHARS = 20000;
/** Characters of one cell's source kept (the server takes 200,000). */
const SOURCE_CHARS = 100000;
/** Lines of a traceback kept (the last ones) and outputs of a cell kept (the last ones). */
const TRACEBACK_LINES = 200;
const OUTPUTS = 50;

/** What a message says when "Fix this error" sends it. */
export const FIX_TEXT =
  'Fix this error: explain what went wrong, then give the corrected cell as one Python code block.';

export const CONTEXT_COMMANDS = {
  askSelection: 'workbench:ask-selection',
  includeNotebook: 'workbench:include-notebook',
  fixError: 'workbench:fix-error'
} as const;

const tail = (text: string, n: number) =>
  text.length > n ? `[… ${text.length - n} characters cut]\n` + text.slice(-n) : text;
const joined = (v: unknown) => (Array.isArray(v) ? v.join('') : typeof v === 'string' ? v : '');

/** One nbformat output as text the model can read (an image becomes a note). */
export function outputText(o: any): IAttachedOutput[] {
  if (o?.output_type === 'stream') {
    return [{ type: 'stream', text: tail(stripAnsi(joined(o.text)), OUTPUT_CHARS) }];
  }
  if (o?.output_type === 'error') {
    const traceback = (Array.isArray(o.traceback) ? o.traceback : [])
      .slice(-TRACEBACK_LINES)
      .map((l: unknown) => tail(stripAnsi(String(l)), OUTPUT_CHARS));
    return [
      {
        type: 'error',
        ename: String(o.ename ?? 'Error').slice(0, 200),
        evalue: tail(stripAnsi(String(o.evalue ?? '')), OUTPUT_CHARS),
        traceback
      }
    ];
  }
  if (o?.output_type === 'execute_result' || o?.output_type === 'display_data') {
    const data = o.data && typeof o.data === 'object' ? o.data : {};
    const out: IAttachedOutput[] = [];
    if (data['text/plain'] !== undefined) {
      out.push({ type: 'result', text: tail(stripAnsi(joined(data['text/plain'])), OUTPUT_CHARS) });
    }
    const other = Object.keys(data).filter(k => k !== 'text/plain');
    if (other.length) {
      out.push({ type: 'note', text: `not sent: a ${other.slice(0, 5).join(', ')} output` });
    }
    return out;
  }
  return [];
}

function cellOf(nb: NotebookPanel, index: number): IAttachedCell {
  const model = nb.content.model!.cells.get(index);
  const json: any = model.toJSON();
  const outputs: IAttachedOutput[] = [];
  for (const o of (Array.isArray(json.outputs) ? json.outputs : []).slice(-OUTPUTS)) {
    outputs.push(...outputText(o));
  }
  const type = model.type === 'markdown' || model.type === 'raw' ? model.type : 'code';
  return {
    index,
    id: String(model.id || '').slice(0, 200) || undefined,
    cell_type: type,
    source: tail(model.sharedModel.getSource(), SOURCE_CHARS),
    outputs: outputs.slice(-100)
  };
}

const size = (c: IAttachedCell) =>
  c.source.length +
  c.outputs.reduce(
    (n, o) =>
      n + (o.text || '').length + (o.evalue || '').length + (o.traceback || []).join('').length,
    0
  );

/** The cells `indexes` of `nb` as an attachment, within BUDGET characters (the rest counted in `omitted`). */
export function attachmentOf(
  nb: NotebookPanel,
  indexes: number[],
  kind: 'cells' | 'notebook'
): IAttachment {
  const cells: IAttachedCell[] = [];
  let used = 0;
  for (const i of indexes) {
    const c = cellOf(nb, i);
    if (cells.length && used + size(c) > BUDGET) {
      break;
    }
    used += size(c);
    cells.push(c);
  }
  return { kind, path: nb.context.path, cells, omitted: indexes.length - cells.length };
}

/** Cell numbers (from 1, as the notebook shows them) as a short range: "3", "3-4", "1, 3-5". */
export function cellRange(indexes: number[]): string {
  const spans: [number, number][] = [];
  for (const n of [...new Set(indexes.map(i => i + 1))].sort((a, b) => a - b)) {
    const last = spans[spans.length - 1];
    if (last && n === last[1] + 1) {
      last[1] = n;
    } else {
      spans.push([n, n]);
    }
  }
  return spans.map(([a, b]) => (a === b ? `${a}` : `${a}-${b}`)).join(', ');
}

/** How a person names an attachment: "cells 3-4 of analysis.ipynb" (workbench/attachments.py `label`). */
export function label(att: IAttachment): string {
  const name = String(att.path || 'a notebook')
    .split('/')
    .pop();
  const cells = Array.isArray(att.cells) ? att.cells : [];
  if (att.kind === 'notebook') {
    return `the notebook ${name}`;
  }
  const numbers = cellRange(cells.map(c => Number(c.index) || 0));
  return `${cells.length === 1 ? 'cell' : 'cells'} ${numbers} of ${name}`;
}

/** The text of one attached cell as a reader of the chip sees it (put in as text, never as HTML). */
function cellText(c: IAttachedCell): string {
  const parts = [String(c.source ?? '')];
  for (const o of Array.isArray(c.outputs) ? c.outputs : []) {
    if (o.type === 'error') {
      parts.push(
        (Array.isArray(o.traceback) ? o.traceback.join('\n') : '') || `${o.ename}: ${o.evalue}`
      );
    } else {
      parts.push(String(o.text ?? ''));
    }
  }
  return parts.filter(p => p).join('\n──\n');
}

/** A chip that opens to show what an attachment sent; `remove` adds a × that takes it off (the composer's). */
export function chip(att: IAttachment, remove?: () => void): HTMLElement {
  const cells = Array.isArray(att.cells) ? att.cells : [];
  const body = h(
    'div',
    { class: 'jp-wb-attachment-cells' },
    ...cells.map(c =>
      h(
        'div',
        { class: 'jp-wb-attachment-cell' },
        h(
          'div',
          { class: 'jp-wb-attachment-head' },
          `cell ${(Number(c.index) || 0) + 1} · ${c.cell_type}`
        ),
        h('pre', { class: 'jp-wb-attachment-text' }, cellText(c))
      )
    ),
    att.omitted
      ? h('div', { class: 'jp-wb-note' }, `${att.omitted} more cells left out (over the budget)`)
      : null
  );
  const summary = h(
    'summary',
    { title: 'What was sent with the message' },
    h('span', { class: 'jp-wb-attachment-label' }, label(att))
  );
  const node = h('details', { class: 'jp-wb-attachment' }, summary, body);
  if (remove) {
    summary.append(
      h(
        'button',
        {
          class: 'jp-wb-button jp-wb-attachment-remove',
          title: 'Do not send this with the message',
          'aria-label': `Remove ${label(att)}`,
          onclick: (e: Event) => {
            e.preventDefault();
            remove();
          }
        },
        '×'
      )
    );
  }
  return node;
}

/** The attachments waiting in the composer: sent with the next message, shown as chips above it. */
export class PendingContext {
  readonly node = h('div', { class: 'jp-wb-pending', 'aria-label': 'Sent with the next message' });
  private items: IAttachment[] = [];

  get attachments(): IAttachment[] {
    return [...this.items];
  }

  add(att: IAttachment): void {
    // the same cells of the same notebook again take the place of the earlier ones
    this.items = this.items.filter(a => label(a) !== label(att) || a.path !== att.path);
    this.items.push(att);
    this.items = this.items.slice(-PENDING);
    this.draw();
  }

  /** Take these off (they were sent); any added since stay. */
  remove(sent: IAttachment[]): void {
    this.items = this.items.filter(a => !sent.includes(a));
    this.draw();
  }

  private draw(): void {
    this.node.replaceChildren(
      ...this.items.map(att =>
        chip(att, () => {
          this.items = this.items.filter(a => a !== att);
          this.draw();
        })
      )
    );
  }
}

/** The cell Replace writes to: the only cell of a message's `cells` attachment. */
export interface IReplaceTarget {
  path: string;
  index: number;
  id?: string;
}

/** The cell the agent's code may replace after a message with `attachments`; null when not one cell. */
export function replaceTarget(attachments: unknown): IReplaceTarget | null {
  if (!Array.isArray(attachments)) {
    return null;
  }
  const cells = attachments.filter(a => a?.kind === 'cells' && Array.isArray(a.cells));
  if (cells.length !== 1 || cells[0].cells.length !== 1) {
    return null;
  }
  const [c] = cells[0].cells;
  return {
    path: String(cells[0].path),
    index: Number(c.index) || 0,
    id: c.id ? String(c.id) : undefined
  };
}

/**
 * Replace the source of the target cell with `code`: found by its id (by its index when it has none); an
 * edit of the shared model, so the notebook's undo takes it back. The words to show, or null if done.
 */
export function replaceCell(
  notebooks: INotebookTracker | null | undefined,
  target: IReplaceTarget,
  code: string,
  activate?: (id: string) => void
): string | null {
  const nb = notebooks?.find(p => p.context.path === target.path);
  const cells = nb?.content.model?.cells;
  if (!nb || !cells) {
    return `Open ${target.path.split('/').pop()} first`;
  }
  let index = -1;
  for (let i = 0; i < cells.length; i++) {
    if (target.id ? cells.get(i).id === target.id : i === target.index) {
      index = i;
      break;
    }
  }
  if (index < 0) {
    return 'That cell is no longer in the notebook';
  }
  cells.get(index).sharedModel.setSource(code);
  nb.content.activeCellIndex = index;
  activate?.(nb.id);
  return null;
}

/** Whether a cell's last output is an error (what "Fix this error" is offered on). */
function failed(nb: NotebookPanel | null, index: number): boolean {
  const cell = nb?.content.model?.cells.get(index);
  const outputs: any[] = (cell?.toJSON() as any)?.outputs || [];
  return outputs.length > 0 && outputs[outputs.length - 1]?.output_type === 'error';
}

/** What the panel offers these commands: take an attachment into the composer, or send one at once. */
export interface IContextTarget {
  readonly id: string;
  addContext(att: IAttachment, text?: string): void;
  send(text?: string, fromComposer?: boolean, attachments?: IAttachment[]): Promise<void>;
}

/** Add "Ask about selection", "Include the active notebook" and "Fix this error", with menus and a button. */
export function addContextCommands(
  app: JupyterFrontEnd,
  panel: IContextTarget,
  notebooks: INotebookTracker | null,
  palette: ICommandPalette | null
): void {
  if (!notebooks) {
    return;
  }
  const { commands, shell } = app;
  const current = () => notebooks.currentWidget;
  commands.addCommand(CONTEXT_COMMANDS.askSelection, {
    label: 'Ask about selection',
    caption: 'Attach the selected cells (source and outputs) to the next Workbench message',
    isEnabled: () => !!current()?.content.model,
    execute: () => {
      const nb = current();
      if (!nb?.content.model) {
        return;
      }
      const indexes = nb.content.widgets
        .map((cell, i) => (nb.content.isSelectedOrActive(cell) ? i : -1))
        .filter(i => i >= 0);
      panel.addContext(attachmentOf(nb, indexes, 'cells'));
      shell.activateById(panel.id);
    }
  });
  commands.addCommand(CONTEXT_COMMANDS.includeNotebook, {
    label: 'Include the active notebook',
    caption: `Attach every cell of the active notebook (up to ${BUDGET.toLocaleString()} characters) to the next Workbench message`,
    isEnabled: () => !!current()?.content.model,
    execute: () => {
      const nb = current();
      if (!nb?.content.model) {
        return;
      }
      const all = Array.from({ length: nb.content.model.cells.length }, (_, i) => i);
      panel.addContext(attachmentOf(nb, all, 'notebook'));
      shell.activateById(panel.id);
    }
  });
  commands.addCommand(CONTEXT_COMMANDS.fixError, {
    label: 'Fix this error',
    caption:
      'Send the failed cell, its error and traceback to the Workbench agent and ask for a fix',
    isEnabled: () => failed(current(), current()?.content.activeCellIndex ?? -1),
    execute: async () => {
      const nb = current();
      const index = nb?.content.activeCellIndex ?? -1;
      if (!nb || !failed(nb, index)) {
        return;
      }
      shell.activateById(panel.id);
      await panel.send(FIX_TEXT, false, [attachmentOf(nb, [index], 'cells')]);
    }
  });
  for (const command of Object.values(CONTEXT_COMMANDS)) {
    palette?.addItem({ command, category: 'Workbench' });
    app.contextMenu.addItem({ command, selector: '.jp-Notebook .jp-Cell', rank: 61 });
  }
  // A button on each notebook's toolbar: enabled while the active cell's last output is an error.
  notebooks.widgetAdded.connect((_, nb) => {
    const button = new ToolbarButton({
      className: 'jp-wb-fix-error',
      label: 'Fix error',
      tooltip: 'Fix this error: send the failed cell to the Workbench agent',
      enabled: false,
      onClick: () => void commands.execute(CONTEXT_COMMANDS.fixError)
    });
    const update = () => {
      button.enabled = failed(nb, nb.content.activeCellIndex);
    };
    nb.content.activeCellChanged.connect(update);
    nb.model?.contentChanged.connect(update);
    nb.context.ready.then(() => {
      nb.model?.contentChanged.connect(update);
      update();
    });
    const executed = (_: unknown, args: { notebook: unknown }) => {
      if (args.notebook === nb.content) {
        update();
      }
    };
    NotebookActions.executed.connect(executed);
    nb.disposed.connect(() => NotebookActions.executed.disconnect(executed));
    nb.toolbar.insertItem(10, 'workbenchFixError', button);
  });
}
