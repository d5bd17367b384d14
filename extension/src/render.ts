// Rendering the chat as JupyterLab renders a notebook: Markdown and MIME bundles through the
// app's own rendermime registry (untrusted, so HTML goes through JupyterLab's sanitizer and no
// script runs), code blocks highlighted by its Markdown renderer, and on each code block a Copy
// and an "Insert as a new cell" button. Without a registry (another frontend) everything falls
// back to plain text nodes.
import { Clipboard } from '@jupyterlab/apputils';
import { IEditorLanguageRegistry } from '@jupyterlab/codemirror';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IRenderMimeRegistry, MimeModel } from '@jupyterlab/rendermime';
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';

import { IReplaceTarget, replaceCell } from './context';
import { h, imageSource, richText } from './dom';

/** What the chat renders with: all optional, so the chat still works without them. */
export interface IRenderContext {
  rendermime?: IRenderMimeRegistry | null;
  /** CodeMirror's languages: a tool card's code is highlighted as the notebook highlights a cell. */
  languages?: IEditorLanguageRegistry | null;
  notebooks?: INotebookTracker | null;
  /** Bring a widget to the front (the shell's activateById). */
  activate?: (id: string) => void;
}

/** A MIME bundle as a notebook output holds it; a plain string (a text/plain result) or junk becomes text/plain. */
export function asBundle(value: unknown): Record<string, unknown> {
  if (typeof value === 'string') {
    return { 'text/plain': value };
  }
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    const data = (value as any).data;
    const bundle = data && typeof data === 'object' && !Array.isArray(data) ? data : value;
    if (Object.keys(bundle).length) {
      return bundle as Record<string, unknown>;
    }
  }
  return { 'text/plain': value === undefined ? '' : JSON.stringify(value) };
}

/** Alt text for an output image: its bundle's text/plain (e.g. "<Figure size 640x480 with 1 Axes>"). */
function altText(bundle: Record<string, unknown>): string {
  const plain = bundle['text/plain'];
  const text = (Array.isArray(plain) ? plain.join('') : String(plain ?? '')).trim();
  return text ? text.slice(0, 200) : 'an image output of the code';
}

export class ChatRenderer {
  private renderers: IRenderMime.IRenderer[] = [];
  /** The cell a reply's code may replace (the one cell its message asked about); set by the chat. */
  target: IReplaceTarget | null = null;

  constructor(private ctx: IRenderContext = {}) {}

  /** Forget (and dispose) what was rendered so far: the chat was cleared. */
  clear(): void {
    for (const r of this.renderers) {
      r.dispose();
    }
    this.renderers = [];
  }

  /** Markdown text (a message, the user's or a reply), rendered by JupyterLab's Markdown renderer, sanitized. */
  markdown(text: string): HTMLElement {
    const host = h('div', { class: 'jp-wb-text jp-wb-markdown' });
    const rm = this.ctx.rendermime;
    // the target as it is now: the rendering ends later, when the chat may have moved on to another message
    const target = this.target;
    if (!rm) {
      host.append(richText(text));
      this.decorate(host, target);
      return host;
    }
    const renderer = rm.createRenderer('text/markdown');
    this.renderers.push(renderer);
    host.append(renderer.node);
    renderer
      .renderModel(new MimeModel({ data: { 'text/markdown': text }, trusted: false }))
      .then(() => {
        this.typeset(renderer.node);
        this.decorate(host, target);
      })
      .catch(() => {
        host.replaceChildren(richText(text));
        this.decorate(host, target);
      });
    return host;
  }

  /**
   * Code in `lang` as a notebook cell shows it: a `<pre><code class="language-…">` highlighted by
   * CodeMirror's language registry (the same call JupyterLab's Markdown renderer makes for a fenced
   * block, so the colours follow the theme); plain text until then, or without a registry.
   */
  code(code: string, lang = 'python'): HTMLElement {
    const el = h('code', { class: `language-${lang}` }, code);
    const pre = h('pre', { class: 'jp-wb-code' }, el);
    const languages = this.ctx.languages;
    const language = languages?.findBest(lang);
    if (languages && language) {
      const lit = h('code', { class: `language-${lang}` });
      languages
        .highlight(code, language, lit)
        .then(() => {
          if (lit.textContent === code) {
            el.replaceWith(lit);
          }
        })
        .catch(() => undefined); // the plain text stays
    }
    return pre;
  }

  /** A MIME bundle a tool produced, rendered as a notebook renders an untrusted output. */
  bundle(value: unknown, metadata: Record<string, unknown> = {}): HTMLElement {
    const data = asBundle(value);
    const host = h('div', { class: 'jp-wb-mime' });
    const rm = this.ctx.rendermime;
    // An SVG as an <img> is a picture only (no script of it runs); rendermime would refuse an untrusted one.
    const mime = rm?.preferredMimeType(data as any, 'any');
    if (!rm || !mime || mime === 'image/svg+xml') {
      host.append(this.plainBundle(data));
      return host;
    }
    const renderer = rm.createRenderer(mime);
    this.renderers.push(renderer);
    host.append(renderer.node);
    const safeMeta =
      metadata && typeof metadata === 'object' && !Array.isArray(metadata) ? metadata : {};
    renderer
      .renderModel(new MimeModel({ data: data as any, metadata: safeMeta as any, trusted: false }))
      .then(() => {
        this.typeset(renderer.node);
        this.labelImages(host, data);
      })
      .catch(() => host.replaceChildren(this.plainBundle(data)));
    return host;
  }

  /**
   * Math through the app's LaTeX typesetter (MathJax), as a Markdown cell typesets it. A renderer types
   * set only once Lumino attaches its widget, and the chat places renderer nodes itself, so it asks here.
   */
  private typeset(node: HTMLElement): void {
    const typesetter = this.ctx.rendermime?.latexTypesetter;
    if (typesetter) {
      void Promise.resolve(typesetter.typeset(node)).catch(() => undefined); // the source stays as written
    }
  }

  /** A bundle without rendermime: an image, an SVG as a picture, or its text. */
  private plainBundle(data: Record<string, unknown>): HTMLElement {
    for (const mime of ['image/png', 'image/jpeg', 'image/gif', 'image/webp']) {
      const src = data[mime] && imageSource(mime, data[mime]);
      if (src) {
        return h('img', { class: 'jp-wb-image', src, alt: altText(data) });
      }
    }
    if (typeof data['image/svg+xml'] === 'string') {
      return h('img', {
        class: 'jp-wb-image',
        alt: altText(data),
        src: `data:image/svg+xml;charset=utf-8,${encodeURIComponent(data['image/svg+xml'])}`
      });
    }
    const text = data['text/markdown'] ?? data['text/latex'] ?? data['text/plain'];
    return h(
      'pre',
      { class: 'jp-wb-stdout' },
      typeof text === 'string' ? text : Array.isArray(text) ? text.join('') : JSON.stringify(data)
    );
  }

  private labelImages(host: HTMLElement, data: Record<string, unknown>): void {
    for (const img of host.querySelectorAll('img')) {
      if (!img.getAttribute('alt')) {
        img.setAttribute('alt', altText(data));
      }
    }
  }

  /** Copy and Insert buttons on every code block of `host` (a rendered message or a tool card), and Replace
   * when the message's code may replace a cell (`target`). */
  decorate(host: HTMLElement, target: IReplaceTarget | null = null): void {
    for (const img of host.querySelectorAll('img')) {
      if (!img.getAttribute('alt')) {
        img.setAttribute('alt', 'an image in the message');
      }
    }
    for (const pre of host.querySelectorAll('pre')) {
      this.codeActions(pre as HTMLElement, undefined, target);
    }
  }

  /** Wrap a code block with its actions: Copy, and Insert as a new cell in the active notebook. */
  codeActions(
    pre: HTMLElement,
    source?: () => string,
    target: IReplaceTarget | null = null
  ): HTMLElement {
    if (pre.parentElement?.classList.contains('jp-wb-codeblock')) {
      return pre.parentElement;
    }
    const code = source ?? (() => (pre.textContent || '').replace(/\n$/, ''));
    const status = h('span', { class: 'jp-wb-code-status', role: 'status' });
    const actions = h(
      'div',
      { class: 'jp-wb-code-actions' },
      status,
      h(
        'button',
        {
          class: 'jp-wb-button jp-wb-copy',
          title: 'Copy this code to the clipboard',
          'aria-label': 'Copy code',
          onclick: () => {
            Clipboard.copyToSystem(code());
            status.textContent = 'Copied';
          }
        },
        'Copy'
      ),
      h(
        'button',
        {
          class: 'jp-wb-button jp-wb-insert',
          title: 'Insert this code as a new cell below the active cell of the active notebook',
          'aria-label': 'Insert code as a new notebook cell',
          onclick: () => {
            status.textContent = this.insertCell(code()) ? 'Inserted' : 'Open a notebook first';
          }
        },
        'Insert'
      )
    );
    if (target) {
      const name = target.path.split('/').pop();
      actions.append(
        h(
          'button',
          {
            class: 'jp-wb-button jp-wb-replace',
            title: `Replace the source of cell ${target.index + 1} of ${name} with this code (undo in the notebook takes it back)`,
            'aria-label': `Replace cell ${target.index + 1} of ${name} with this code`,
            onclick: () => {
              const refused = replaceCell(this.ctx.notebooks, target, code(), this.ctx.activate);
              status.textContent = refused ?? `Replaced cell ${target.index + 1}`;
            }
          },
          'Replace'
        )
      );
    }
    const box = h('div', { class: 'jp-wb-codeblock' });
    pre.replaceWith(box);
    box.append(actions, pre);
    return box;
  }

  /** Insert `code` as a new code cell below the active cell of the active notebook; false if none is open. */
  insertCell(code: string): boolean {
    const panel = this.ctx.notebooks?.currentWidget;
    const notebook = panel?.content;
    const model = notebook?.model;
    if (!panel || !notebook || !model) {
      return false;
    }
    const index = Math.min(notebook.activeCellIndex + 1, model.cells.length);
    model.sharedModel.insertCell(index, { cell_type: 'code', source: code });
    notebook.activeCellIndex = index;
    notebook.mode = 'command';
    this.ctx.activate?.(panel.id);
    const cell = notebook.widgets[index];
    if (cell) {
      void notebook.scrollToCell(cell);
    }
    return true;
  }
}
