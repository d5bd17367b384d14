// The Files tab: the selected session's workspace (list, download) and attaching files to it
// (from this computer, from JupyterLab's file browser, a notebook cell or its selection).
// Routes: docs/api.md, "Files". Everything shown comes from the workspace (the agent's code names
// the files), so it goes in as text.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ApiError, WorkbenchApi } from './api';
import { h, imageSource } from './dom';

export interface IWorkspaceFile {
  path: string;
  type: 'file' | 'dir' | 'link' | 'other';
  bytes: number | null;
  mtime: number;
}

export interface IListing {
  files: IWorkspaceFile[];
  truncated: boolean;
  workspace: boolean;
}

/** The `file_attached` record an upload returns. */
export interface IAttached {
  name: string;
  path: string;
  bytes: number;
  sha256: string;
  kind: string;
  seq: number;
}

export type AttachKind = 'file' | 'cell' | 'selection' | 'text';

function route(id: string, rest = ''): string {
  return `sessions/${encodeURIComponent(id)}/files${rest}`;
}

export function listFiles(api: WorkbenchApi, id: string): Promise<IListing> {
  return api.request<IListing>(route(id));
}

/** Upload bytes to `path` in the session's workspace (POST .../files; the raw body). */
export function uploadFile(
  api: WorkbenchApi,
  id: string,
  path: string,
  data: Blob | ArrayBuffer | Uint8Array | string,
  kind: AttachKind = 'file',
  name = ''
): Promise<IAttached> {
  const params = new URLSearchParams({ path, kind });
  if (name) {
    params.set('name', name);
  }
  return api.request<IAttached>(`${route(id)}?${params.toString()}`, {
    method: 'POST',
    body: data as BodyInit,
    headers: { 'Content-Type': 'application/octet-stream' }
  });
}

/** The bytes of a workspace file, as a Blob; ApiError with the server's message. */
export async function fetchFile(api: WorkbenchApi, id: string, path: string): Promise<Blob> {
  const url = URLExt.join(api.settings.baseUrl, 'workbench/api', route(id, '/content'));
  const response = await ServerConnection.makeRequest(
    `${url}?${new URLSearchParams({ path }).toString()}`,
    {},
    api.settings
  );
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      message = (await response.json()).error || message;
    } catch {
      // not JSON: keep the status line
    }
    throw new ApiError(response.status, message);
  }
  return response.blob();
}

/** Bytes to base64 (for a data: URL), a chunk at a time (no argument list the size of the file). */
export function toBase64(bytes: Uint8Array): string {
  let raw = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    raw += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(raw);
}

/** Base64 (as the contents API gives a file) to bytes. */
export function fromBase64(data: string): Uint8Array {
  const raw = atob(data.replace(/\s/g, ''));
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) {
    out[i] = raw.charCodeAt(i);
  }
  return out;
}

export function humanBytes(n: number | null): string {
  if (n === null || n === undefined) {
    return '';
  }
  const units = ['B', 'KB', 'MB', 'GB'];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u ? `${v.toFixed(1)} ${units[u]}` : `${v} B`;
}

/** The largest file a preview reads (a bigger one is downloaded to be seen). */
const PREVIEW_BYTES = 2 * 1024 * 1024;
/** The characters of a text file a preview shows. */
const PREVIEW_CHARS = 200_000;

/** The image type of `bytes` by their first bytes (not by the name the agent's code gave them), or ''. */
export function imageType(bytes: Uint8Array, path: string): string {
  const starts = (...sig: number[]) => sig.every((b, i) => bytes[i] === b);
  if (starts(0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a)) {
    return 'image/png';
  }
  if (starts(0xff, 0xd8, 0xff)) {
    return 'image/jpeg';
  }
  if (starts(0x47, 0x49, 0x46, 0x38)) {
    return 'image/gif';
  }
  if (starts(0x52, 0x49, 0x46, 0x46) && String.fromCharCode(...bytes.slice(8, 12)) === 'WEBP') {
    return 'image/webp';
  }
  // an SVG is text: shown as an image (an <img> runs none of its scripts), never as a document
  if (/\.svg$/i.test(path) && new TextDecoder().decode(bytes.slice(0, 4096)).includes('<svg')) {
    return 'image/svg+xml';
  }
  return '';
}

export class FilesView {
  readonly node = h('section', { class: 'jp-wb-tab jp-wb-files', 'aria-label': 'Workspace files' });
  private session: string | null = null;
  private heading = h('span', { class: 'jp-wb-files-title' }, 'Workspace files');
  private preview = h('section', { class: 'jp-wb-file-preview', hidden: true });
  private list = h('ul', { class: 'jp-wb-file-list', 'aria-label': 'Files in the workspace' });
  private status = h('div', { class: 'jp-wb-empty', role: 'status' });
  private picker = h('input', {
    type: 'file',
    class: 'jp-wb-file-picker',
    multiple: true,
    hidden: true
  });
  private generation = 0;

  constructor(
    private api: WorkbenchApi,
    private onAttached: (rec: IAttached) => void = () => undefined
  ) {
    this.picker.addEventListener('change', () => void this.uploadPicked());
    this.node.append(
      h(
        'div',
        { class: 'jp-wb-section-head' },
        this.heading,
        h(
          'span',
          {},
          h(
            'button',
            {
              class: 'jp-wb-button jp-wb-attach-local',
              title: "Copy files from this computer into the session's workspace",
              onclick: () => this.picker.click()
            },
            'Attach…'
          ),
          h(
            'button',
            {
              class: 'jp-wb-button',
              title: 'List the workspace again',
              onclick: () => void this.refresh()
            },
            'Refresh'
          )
        )
      ),
      this.picker,
      this.status,
      this.list,
      this.preview
    );
    this.show(null);
  }

  /** The session whose workspace is shown (null: none selected), named by its title. */
  setSession(id: string | null, title = ''): void {
    const name = id ? `Files of ${title || 'an untitled session'}` : 'Workspace files';
    this.heading.textContent = this.heading.title = name;
    this.node.setAttribute('aria-label', name);
    if (id !== this.session) {
      this.session = id;
      this.list.replaceChildren();
      this.closePreview();
      if (!this.node.hidden) {
        void this.refresh();
      }
    }
  }

  /** Show a workspace file here: an image as an image, text as text, anything else says to download it. */
  async showPreview(f: IWorkspaceFile): Promise<void> {
    const id = this.session;
    if (!id) {
      return;
    }
    const close = h(
      'button',
      {
        class: 'jp-wb-link',
        'aria-label': `Close the preview of ${f.path}`,
        onclick: () => this.closePreview()
      },
      'Close'
    );
    const head = h(
      'div',
      { class: 'jp-wb-section-head' },
      h('span', { class: 'jp-wb-file-name', title: f.path }, f.path),
      close
    );
    const body = h('div', { class: 'jp-wb-preview-body' }, 'Loading…');
    this.closePreview();
    this.preview.replaceChildren(head, body);
    this.preview.setAttribute('aria-label', `Preview of ${f.path}`);
    this.preview.hidden = false;
    if ((f.bytes ?? 0) > PREVIEW_BYTES) {
      body.textContent = `${humanBytes(f.bytes)}: too large to preview here; download it to open it.`;
      return;
    }
    try {
      const blob = await fetchFile(this.api, id, f.path);
      if (id !== this.session || !this.preview.contains(body)) {
        return; // another session or file was chosen meanwhile
      }
      const bytes = new Uint8Array(await blob.arrayBuffer());
      const image = imageType(bytes, f.path);
      if (image) {
        const src = imageSource(image, toBase64(bytes));
        body.replaceChildren(
          src ? h('img', { src, alt: `The image ${f.path}`, class: 'jp-wb-image' }) : ''
        );
        return;
      }
      let text: string | null = null;
      try {
        text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
      } catch {
        text = null;
      }
      if (text === null || text.includes('\0')) {
        body.textContent = `A binary file of ${humanBytes(bytes.length)}: no preview; download it to open it.`;
        return;
      }
      const cut = text.length > PREVIEW_CHARS;
      body.replaceChildren(
        h('pre', { class: 'jp-wb-stdout' }, cut ? text.slice(0, PREVIEW_CHARS) : text),
        cut
          ? h(
              'div',
              { class: 'jp-wb-meta' },
              `the first ${PREVIEW_CHARS.toLocaleString()} characters`
            )
          : ''
      );
    } catch (err) {
      body.textContent = `Could not preview ${f.path}: ${(err as Error).message || err}`;
    }
  }

  private closePreview(): void {
    this.preview.hidden = true;
    this.preview.replaceChildren();
  }

  /** Something may have changed in the workspace (a tool call ended, a file was attached). */
  changed(): void {
    if (!this.node.hidden) {
      void this.refresh();
    }
  }

  async refresh(): Promise<void> {
    const id = this.session;
    const mine = ++this.generation;
    if (!id) {
      this.show(null);
      return;
    }
    try {
      const listing = await listFiles(this.api, id);
      if (mine === this.generation) {
        this.show(listing);
      }
    } catch (err) {
      if (mine === this.generation) {
        this.status.textContent = String((err as Error).message || err);
      }
    }
  }

  /** Upload to the shown session; the record, or an error shown here (and thrown). */
  async attach(
    path: string,
    data: Blob | ArrayBuffer | Uint8Array | string,
    kind: AttachKind,
    name = ''
  ): Promise<IAttached> {
    const id = this.session;
    if (!id) {
      throw new Error('Select a session in the Workbench sidebar first.');
    }
    const rec = await uploadFile(this.api, id, path, data, kind, name);
    this.onAttached(rec);
    await this.refresh();
    return rec;
  }

  private async uploadPicked(): Promise<void> {
    const files = Array.from(this.picker.files || []);
    this.picker.value = '';
    for (const f of files) {
      try {
        const rec = await this.attach(f.name, f, 'file', f.name);
        this.status.textContent = `Attached ${rec.path} (${humanBytes(rec.bytes)})`;
      } catch (err) {
        this.status.textContent = `Could not attach ${f.name}: ${(err as Error).message || err}`;
      }
    }
  }

  private show(listing: IListing | null): void {
    if (!listing) {
      this.status.textContent = 'Select a session to see the files its code can read and wrote.';
      this.list.replaceChildren();
      return;
    }
    const files = listing.files;
    this.status.textContent = !listing.workspace
      ? 'No workspace yet: it is made by the first code call or the first attached file.'
      : files.length
        ? `${files.length} entries${listing.truncated ? ' (more not listed)' : ''}`
        : 'The workspace is empty.';
    this.list.replaceChildren(...files.map(f => this.row(f)));
  }

  private row(f: IWorkspaceFile): HTMLElement {
    const depth = f.path.split('/').length - 1;
    const name = f.path.split('/').pop() || f.path;
    const label =
      f.type === 'dir' ? `${name}/` : f.type === 'link' ? `${name} (link, not followed)` : name;
    return h(
      'li',
      {
        class: `jp-wb-file jp-wb-file-${f.type}`,
        'data-path': f.path,
        title: f.path,
        style: `padding-left: ${8 + depth * 12}px`
      },
      h('span', { class: 'jp-wb-file-name' }, label),
      h('span', { class: 'jp-wb-meta' }, humanBytes(f.bytes)),
      f.type === 'file' &&
        h(
          'button',
          {
            class: 'jp-wb-link jp-wb-preview',
            title: `Preview ${f.path}`,
            'aria-label': `Preview ${f.path}`,
            onclick: () => void this.showPreview(f)
          },
          'Preview'
        ),
      f.type === 'file' &&
        h(
          'button',
          {
            class: 'jp-wb-link jp-wb-download',
            title: `Download ${f.path}`,
            'aria-label': `Download ${f.path}`,
            onclick: () => void this.download(f.path)
          },
          'Download'
        )
    );
  }

  private async download(path: string): Promise<void> {
    const id = this.session;
    if (!id) {
      return;
    }
    try {
      const blob = await fetchFile(this.api, id, path);
      const url = URL.createObjectURL(blob);
      const a = h('a', { href: url, download: path.split('/').pop() || 'download' });
      document.body.append(a);
      a.click();
      a.remove();
      window.setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (err) {
      this.status.textContent = `Could not download ${path}: ${(err as Error).message || err}`;
    }
  }
}
