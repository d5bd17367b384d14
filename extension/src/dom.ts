// A tiny hyperscript helper: the sidebar is plain DOM, small enough not to need React.

type Child = Node | string | null | undefined | false;

/** Create an element with classes/attributes and children. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: { [key: string]: any } = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) {
      continue;
    }
    if (key === 'class') {
      el.className = value;
    } else if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else {
      el.setAttribute(key, String(value));
    }
  }
  for (const child of children) {
    if (child !== null && child !== undefined && child !== false) {
      el.append(child);
    }
  }
  return el;
}

/** Strip ANSI colour codes (kernel tracebacks carry them). */
export function stripAnsi(text: string): string {
  // eslint-disable-next-line no-control-regex
  return text.replace(/\u001b\[[0-9;]*[A-Za-z]/g, '');
}

/** Render text with ``` fenced blocks as <pre>; everything else keeps its line breaks. */
export function richText(text: string): HTMLElement {
  const box = h('div', { class: 'jp-wb-text' });
  const parts = text.split(/```[a-zA-Z]*\n?/);
  parts.forEach((part, i) => {
    if (!part) {
      return;
    }
    box.append(
      i % 2 ? h('pre', { class: 'jp-wb-code' }, part.replace(/\n$/, '')) : h('span', {}, part)
    );
  });
  return box;
}

/** A short relative description of a timestamp, for the session list. */
export function ago(ts: string): string {
  const seconds = (Date.now() - Date.parse(ts)) / 1000;
  if (!isFinite(seconds)) {
    return '';
  }
  if (seconds < 60) {
    return 'just now';
  }
  if (seconds < 3600) {
    return `${Math.floor(seconds / 60)} min ago`;
  }
  if (seconds < 86400) {
    return `${Math.floor(seconds / 3600)} h ago`;
  }
  return new Date(ts).toLocaleDateString();
}
