// Managing sessions from the sidebar: search, the archived filter, the model picker, rename /
// archive / delete on each row, "edit and resend" (a fork) on user messages, token and cost
// display, and the selection that survives a reload. The panel calls these through small hooks.
import { Dialog, InputDialog, showDialog } from '@jupyterlab/apputils';
import { deleteIcon, editIcon, LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { IEvent, ISession, ISessionsPage, WorkbenchApi } from './api';
import { h } from './dom';

// A box with a lid (archive) and the same box with an arrow out of it (unarchive): JupyterLab has no archive
// icon, and the arrows used before (⇣ ⇡) read as Download and Upload. `jp-icon3` follows the theme.
const box = (inner: string) =>
  '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
  '<g class="jp-icon3" fill="#616161"><path d="M3 3h18v4H3z"/>' +
  `<path fill-rule="evenodd" d="M4 8h16v13H4z${inner}"/></g></svg>`;

function capitalized(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** A session as a person names it: its title, or when an untitled one started (never its hex id). */
export function sessionName(s: ISession): string {
  if (s.title) {
    return s.title;
  }
  const at = new Date(s.created_at);
  return isNaN(at.getTime())
    ? 'an untitled session'
    : `the untitled session of ${at.toLocaleString([], { dateStyle: 'medium', timeStyle: 'short' })}`;
}

export const archiveIcon = new LabIcon({ name: 'workbench:archive', svgstr: box('M9 11v2h6v-2z') });
export const unarchiveIcon = new LabIcon({
  name: 'workbench:unarchive',
  svgstr: box('M12 10l-4 4h3v4h2v-4h3z')
});

const SELECTED_KEY = 'jupyter-workbench:selected-session';

export interface IModelChoice {
  name: string;
  default: boolean;
  thinking: string[];
  efforts: string[];
  priced: boolean;
}

export interface IUsageRow {
  seq: number;
  input_tokens: number;
  output_tokens: number;
  cache_read_input_tokens: number;
  cache_creation_input_tokens: number;
  calls: number;
  cost: number;
}

export interface IUsage {
  turns: IUsageRow[];
  total: IUsageRow;
  priced: boolean;
}

/** The session-management routes (docs/api.md, "Managing sessions"). */
export class SessionsApi {
  constructor(private api: WorkbenchApi) {}

  private send<T>(path: string, method: string, body?: unknown): Promise<T> {
    return this.api.request<T>(path, {
      method,
      body: body === undefined ? undefined : JSON.stringify(body)
    });
  }

  session(id: string): Promise<ISession> {
    return this.api.request(`sessions/${encodeURIComponent(id)}`);
  }
  rename(id: string, title: string): Promise<ISession> {
    return this.send(`sessions/${encodeURIComponent(id)}`, 'PATCH', { title });
  }
  archive(id: string, archived: boolean): Promise<ISession> {
    return this.send(`sessions/${encodeURIComponent(id)}`, 'PATCH', { archived });
  }
  remove(id: string): Promise<{ deleted: string; events: number }> {
    return this.send(`sessions/${encodeURIComponent(id)}`, 'DELETE');
  }
  fork(id: string, seq: number): Promise<ISession> {
    return this.send(`sessions/${encodeURIComponent(id)}/fork`, 'POST', { seq });
  }
  usage(id: string): Promise<IUsage> {
    return this.api.request(`sessions/${encodeURIComponent(id)}/usage`);
  }
  async search(q: string, archived: boolean): Promise<ISessionsPage> {
    const params = new URLSearchParams({ q, limit: '100', archived: String(archived) });
    const got = await this.api.request<{ hits: ISession[]; next: string | null }>(
      `search?${params}`
    );
    return { sessions: got.hits, next: null };
  }
  async models(): Promise<IModelChoice[]> {
    return (await this.api.request<{ models: IModelChoice[] }>('models')).models;
  }
}

/** Tokens and cost of a session on one line ("1,234 in · 56 out · $0.0123"). */
export function usageText(u: IUsage): string {
  const t = u.total;
  const ins = t.input_tokens + t.cache_read_input_tokens + t.cache_creation_input_tokens;
  const cost = u.priced ? `$${t.cost.toFixed(4)}` : 'cost unknown';
  return `${ins.toLocaleString()} in · ${t.output_tokens.toLocaleString()} out · ${cost}`;
}

/** The selected session's id, kept across reloads (localStorage; nothing if it is unavailable). */
export const selection = {
  save(id: string | null): void {
    try {
      if (id) {
        window.localStorage.setItem(SELECTED_KEY, id);
      } else {
        window.localStorage.removeItem(SELECTED_KEY);
      }
    } catch {
      // storage refused (private mode, quota): the selection just does not survive a reload
    }
  },
  load(): string | null {
    try {
      return window.localStorage.getItem(SELECTED_KEY);
    } catch {
      return null;
    }
  }
};

/** The search box, the archived filter and the model picker above the session list. */
export class SessionControls {
  readonly sapi: SessionsApi;
  readonly node: HTMLElement;
  private searchBox = h('input', {
    class: 'jp-wb-search jp-mod-styled',
    type: 'search',
    placeholder: 'Search sessions',
    'aria-label': 'Search sessions (titles and messages)'
  });
  private archivedBox = h('input', { type: 'checkbox', class: 'jp-wb-archived-filter' });
  private modelSelect = h('select', {
    class: 'jp-wb-model jp-mod-styled',
    'aria-label': 'Model for new sessions',
    title: 'Model for new sessions'
  });
  private effortSelect = h('select', {
    class: 'jp-wb-effort jp-mod-styled',
    'aria-label': 'Effort for new sessions',
    title: 'Effort (for models that take one)'
  });
  private thinkingSelect = h('select', {
    class: 'jp-wb-thinking jp-mod-styled',
    'aria-label': 'Thinking for new sessions',
    title: 'Thinking (for models that think)'
  });
  private models: IModelChoice[] = [];
  private timer = 0;

  constructor(
    api: WorkbenchApi,
    private changed: () => void,
    private onError: (err: unknown) => void
  ) {
    this.sapi = new SessionsApi(api);
    this.searchBox.addEventListener('input', () => {
      window.clearTimeout(this.timer);
      this.timer = window.setTimeout(() => this.changed(), 250);
    });
    this.archivedBox.addEventListener('change', () => this.changed());
    this.modelSelect.addEventListener('change', () => this.showEfforts());
    this.node = h(
      'div',
      { class: 'jp-wb-session-tools' },
      this.searchBox,
      h('label', { class: 'jp-wb-archived-label' }, this.archivedBox, ' Archived'),
      h(
        'span',
        { class: 'jp-wb-model-row' },
        this.modelSelect,
        this.effortSelect,
        this.thinkingSelect
      )
    );
  }

  /** Fill the model picker from the server's configured models. */
  async loadModels(): Promise<void> {
    try {
      this.models = await this.sapi.models();
    } catch (err) {
      this.onError(err);
      return;
    }
    this.modelSelect.replaceChildren(
      ...this.models.map(m =>
        h(
          'option',
          { value: m.name, selected: m.default || undefined },
          m.name + (m.default ? ' (default)' : '')
        )
      )
    );
    this.showEfforts();
  }

  private showEfforts(): void {
    const m = this.models.find(x => x.name === this.modelSelect.value);
    const efforts = m?.efforts ?? [];
    this.effortSelect.replaceChildren(
      h('option', { value: '' }, 'effort: default'),
      ...efforts.map(e => h('option', { value: e }, `effort: ${e}`))
    );
    this.effortSelect.hidden = !efforts.length;
    const thinking = m?.thinking ?? [];
    this.thinkingSelect.replaceChildren(
      h('option', { value: '' }, 'thinking: default'),
      ...thinking.map(t => h('option', { value: t }, `thinking: ${t}`))
    );
    this.thinkingSelect.hidden = !thinking.length;
  }

  /** The body of POST /sessions for a new session: the picked model and effort, no title (the first message names it). */
  newSessionBody(): { model?: string; config?: { [key: string]: string } } {
    const body: { model?: string; config?: { [key: string]: string } } = {};
    const config: { [key: string]: string } = {};
    if (this.modelSelect.value) {
      body.model = this.modelSelect.value;
    }
    if (!this.effortSelect.hidden && this.effortSelect.value) {
      config.effort = this.effortSelect.value;
    }
    if (!this.thinkingSelect.hidden && this.thinkingSelect.value) {
      config.thinking = this.thinkingSelect.value;
    }
    if (Object.keys(config).length) {
      body.config = config;
    }
    return body;
  }

  get archived(): boolean {
    return this.archivedBox.checked;
  }

  get searching(): string {
    return this.searchBox.value.trim();
  }

  /** The page to show: search hits when there is search text, else null (the panel lists as usual). */
  async search(): Promise<ISessionsPage | null> {
    const q = this.searching;
    return q ? this.sapi.search(q, this.archived) : null;
  }

  /** Rename, archive (or unarchive) and delete buttons for a session (shown beside the selected one's title). */
  rowActions(s: ISession, after: (deleted: boolean) => void): HTMLElement {
    // JupyterLab's own icons where it has one (an emoji such as a wastebasket is an empty box without a
    // colour-emoji font), an icon of ours where it has none
    const act = (label: string | LabIcon, title: string, fn: () => Promise<boolean | void>) =>
      h(
        'button',
        {
          class: 'jp-wb-row-action',
          title,
          'aria-label': `${title}: ${sessionName(s)}`,
          onclick: (e: Event) => {
            e.stopPropagation();
            void fn().catch(err => this.onError(err));
          }
        },
        typeof label === 'string'
          ? label
          : label.element({ tag: 'span', className: 'jp-wb-row-icon' })
      );
    const archived = !!(s as any).archived;
    return h(
      'span',
      { class: 'jp-wb-row-actions' },
      act(editIcon, 'Rename', async () => {
        const got = await InputDialog.getText({ title: 'Rename session', text: s.title || '' });
        if (got.button.accept && got.value && got.value.trim()) {
          await this.sapi.rename(s.id, got.value.trim());
          after(false);
        }
      }),
      act(archived ? unarchiveIcon : archiveIcon, archived ? 'Unarchive' : 'Archive', async () => {
        await this.sapi.archive(s.id, !archived);
        after(false);
      }),
      act(deleteIcon, 'Delete', async () => {
        const ok = await showDialog({
          title: 'Delete session?',
          body: `${s.title ? `“${s.title}”` : capitalized(sessionName(s))} and its ${s.events} events will be removed for good. Memories that cite it keep their provenance.`,
          buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
        });
        if (ok.button.accept) {
          await this.sapi.remove(s.id);
          after(true);
        }
      })
    );
  }
}

/**
 * Give the user message just drawn for `ev` its seq and an "Edit and resend" button: a fork of the
 * session before that message, into which the edited text is sent.
 */
export function markUserMessage(
  logNode: HTMLElement,
  ev: IEvent,
  edit: (seq: number, text: string) => void
): void {
  const all = logNode.querySelectorAll<HTMLElement>('.jp-wb-user');
  const el = all[all.length - 1];
  if (!el || el.querySelector(':scope > .jp-wb-edit-resend')) {
    return;
  }
  el.dataset.seq = String(ev.seq);
  const text = typeof ev.payload?.text === 'string' ? ev.payload.text : '';
  el.append(
    h(
      'button',
      {
        class: 'jp-wb-edit-resend',
        title: 'Edit and resend: a new session forked before this message',
        'aria-label': 'Edit this message and try it again in a fork',
        onclick: () => edit(ev.seq, text)
      },
      'Edit & resend'
    )
  );
}

/** Ask for the edited text of a message (several lines kept); null when cancelled or empty. */
export async function askEdited(text: string): Promise<string | null> {
  const area = h('textarea', {
    class: 'jp-wb-edit-text jp-mod-styled',
    rows: 6,
    'aria-label': 'Edited message'
  });
  area.value = text;
  const got = await showDialog({
    title: 'Edit and resend (in a fork)',
    body: new Widget({ node: h('div', { class: 'jp-wb-edit-body' }, area) }),
    buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Send in a fork' })],
    focusNodeSelector: 'textarea'
  });
  return got.button.accept && area.value.trim() ? area.value : null;
}
