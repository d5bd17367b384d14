// A tiny hyperscript helper: the sidebar is plain DOM, small enough not to need React.
//
// Everything the sidebar shows (session titles, tool output, tracebacks, memories, quotes) comes
// from kernels, models and dreams, so it is hostile. Text goes in as text nodes and attributes
// through setAttribute, never through innerHTML; `h` refuses event-handler attributes given as
// strings and image sources other than base64 data of a known image type.

type Child = Node | string | null | undefined | false;

const IMAGE_TYPES = new Set([
  'image/png',
  'image/jpeg',
  'image/gif',
  'image/webp',
  'image/svg+xml'
]);
const BASE64 = /^[A-Za-z0-9+/\s]*={0,2}\s*$/;

/** A data: URL for base64 image data, or null when the type is not an image type or the data is not base64. */
export function imageSource(mime: unknown, data: unknown): string | null {
  if (
    typeof mime !== 'string' ||
    typeof data !== 'string' ||
    !IMAGE_TYPES.has(mime) ||
    !BASE64.test(data)
  ) {
    return null;
  }
  return `data:${mime};base64,${data.replace(/\s/g, '')}`;
}

/** Create an element with classes/attributes and children (strings become text nodes). */
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
    } else if (key.toLowerCase().startsWith('on')) {
      // A string here would become script: only functions are handlers.
      if (typeof value !== 'function') {
        throw new TypeError(`h(): ${key} must be a function`);
      }
      el.addEventListener(key.slice(2), value);
    } else if (key === 'src' && !String(value).startsWith('data:image/')) {
      throw new TypeError('h(): src must be an image data: URL (use imageSource)');
    } else {
      el.setAttribute(key, String(value));
    }
  }
  for (const child of children) {
    if (child !== null && child !== undefined && child !== false) {
      el.append(child instanceof Node ? child : String(child));
    }
  }
  return el;
}

/** Strip ANSI colour codes (kernel tracebacks carry them). */
export function stripAnsi(text: string): string {
  // eslint-disable-next-line no-control-regex
  return text.replace(/\u001b\[[0-9;]*[A-Za-z]/g, '');
}

/**
 * Render text with fenced code blocks (a line of ``` and a language, up to a line of ```) as
 * <pre>; everything else keeps its line breaks. A ``` inside a sentence is text, not a fence.
 */
export function richText(text: string): HTMLElement {
  const box = h('div', { class: 'jp-wb-text' });
  const fence = /^[ \t]*```[^\n`]*\n([\s\S]*?)^[ \t]*```[ \t]*$\n?/gm;
  let at = 0;
  for (const m of text.matchAll(fence)) {
    if (m.index! > at) {
      box.append(h('span', {}, text.slice(at, m.index)));
    }
    box.append(h('pre', { class: 'jp-wb-code' }, m[1].replace(/\n$/, '')));
    at = m.index! + m[0].length;
  }
  if (at < text.length) {
    box.append(h('span', {}, text.slice(at)));
  }
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

/** `text` with every match of `needle` (any case) in a <mark>: text nodes only, so markup in either stays text. */
export function marked(text: string, needle: string): Node[] {
  const find = needle.trim();
  if (!find) {
    return [document.createTextNode(text)];
  }
  const pattern = new RegExp(find.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'), 'giu');
  const out: Node[] = [];
  let at = 0;
  for (const m of text.matchAll(pattern)) {
    if (m.index! > at) {
      out.push(document.createTextNode(text.slice(at, m.index)));
    }
    out.push(h('mark', {}, m[0]));
    at = m.index! + m[0].length;
  }
  if (at < text.length) {
    out.push(document.createTextNode(text.slice(at)));
  }
  return out;
}

/** A timestamp as people read it, in the reader's time zone: "2 Dec 2026 13:05" ('' for one that is not a time). */
export function when(ts: string): string {
  const t = new Date(ts);
  if (!ts || isNaN(t.getTime())) {
    return '';
  }
  const month = t.toLocaleString('en-GB', { month: 'short' });
  const pad = (n: number) => String(n).padStart(2, '0');
  return `${t.getDate()} ${month} ${t.getFullYear()} ${pad(t.getHours())}:${pad(t.getMinutes())}`;
}
