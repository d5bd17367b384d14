// The memory review as a JupyterLab main-area panel: every memory by status, its provenance and
// history, and the review actions, from the memory routes (docs/api.md, "Memory and dreams").
// Theme: only JupyterLab's CSS variables. Live: it looks again at once when this page reviews a
// memory (the sidebar's Memories tab fires MEMORIES_CHANGED), and polls every few seconds while shown
// for changes from anywhere else (a notebook, the CLI, another browser), redrawing only on a change.
// Memories quote hostile data (sessions, kernels, dreams): titles, quotes and names go in as text; a
// memory's text is Markdown, rendered as the chat renders a reply (JupyterLab's renderer, untrusted:
// sanitized, no script runs). Sources open the session at the cited event in the sidebar; people are
// named as JupyterLab names them; times read as a person writes them.
import { User } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { IMemory, WorkbenchApi } from './api';
import { ago, h, richText, when } from './dom';
import { ChatRenderer } from './render';

export const MEMORIES_CHANGED = 'workbench:memories-changed';
const POLL_MS = 3000;
const STATUSES = ['proposed', 'accepted', 'rejected', 'retired', 'superseded', 'all'] as const;

/** Tell every view of this page that memories changed (after a review here). */
export function memoriesChanged(): void {
  window.dispatchEvent(new CustomEvent(MEMORIES_CHANGED));
}

type Action = 'accept' | 'reject' | 'retire' | 'edit';

const ACTIONS: Record<string, Action[]> = {
  proposed: ['accept', 'edit', 'reject'],
  accepted: ['edit', 'retire']
};

const LABELS: Record<Action, string> = {
  accept: 'Accept',
  reject: 'Reject',
  retire: 'Retire',
  edit: 'Edit'
};

/** What the panel draws with, beyond the API: all optional (without them, text stays plain and sources are not links). */
export interface IReviewContext {
  /** Renders a memory's text as Markdown. */
  render?: ChatRenderer;
  /** Open session `id` at event `seq` (the sidebar's chat, there). */
  open?: (id: string, seq: number) => void;
  /** Who this page's user is: their own actor is shown by their name. */
  user?: User.IManager | null;
}

/** An actor (docs/memory.md) as a reader names it: a person by name, this page's user by JupyterLab's name for them. */
export function who(actor: string | null | undefined, me?: User.IIdentity | null): string {
  const a = String(actor || '');
  if (a.startsWith('person:')) {
    const name = a.slice('person:'.length);
    return me && name === me.username ? me.display_name || me.name || name : name;
  }
  if (a.startsWith('dream:')) {
    return 'a dream';
  }
  if (a.startsWith('agent:')) {
    return 'an agent';
  }
  return a;
}

/** A memory's parts as both the review panel and the sidebar's Memories tab draw them: its text as Markdown, and
 * each cited event as a link that opens its session there. */
export class MemoryParts {
  private titles = new Map<string, Promise<string>>(); // session id -> its title, asked once

  constructor(
    private api: WorkbenchApi,
    private ctx: IReviewContext = {}
  ) {}

  /** A memory's text: Markdown, rendered and sanitized (plain text with code blocks without a renderer). */
  text(text: string): HTMLElement {
    return h(
      'div',
      { class: 'jp-wb-review-text' },
      this.ctx.render ? this.ctx.render.markdown(text) : richText(text)
    );
  }

  /** A cited event: a link that opens its session there (named by its title once known), the ids as its tooltip. */
  source(p: { session_id: string; seq: number }): HTMLElement {
    const id = String(p.session_id);
    const seq = Number(p.seq) || 0;
    const label = h('span', {}, `session ${id}`);
    const link = h(
      'a',
      {
        class: 'jp-wb-review-source',
        href: '#',
        title: `Open session ${id} at event #${seq} in the Workbench sidebar`,
        'data-session-id': id,
        'data-seq': String(seq),
        onclick: (e: Event) => {
          e.preventDefault();
          this.ctx.open?.(id, seq);
        }
      },
      label,
      ` · event #${seq}`
    );
    if (!this.ctx.open) {
      link.removeAttribute('href'); // nothing to open it with: the ids, as text
    }
    void this.sessionTitle(id).then(t => t && (label.textContent = `“${t}”`));
    return link;
  }

  /** A session's title (asked of the server once per session; '' when it has none or is gone). */
  sessionTitle(id: string): Promise<string> {
    let known = this.titles.get(id);
    if (!known) {
      known = this.api
        .request<{ title?: string }>(`sessions/${encodeURIComponent(id)}`)
        .then(s => String(s.title || ''))
        .catch(() => '');
      this.titles.set(id, known);
    }
    return known;
  }
}

export class ReviewPanel extends Widget {
  private status: (typeof STATUSES)[number] = 'proposed';
  private search = '';
  private store = ''; // '' = every store
  private stores = new Set<string>(); // every store a listing has shown
  private storeSelect = h('select', {
    class: 'jp-wb-review-store jp-mod-styled',
    'aria-label': 'Show memories of this store',
    hidden: true, // shown once memories of a second store are seen
    onchange: () => {
      this.store = this.storeSelect.value;
      void this.refresh(true);
    }
  }) as HTMLSelectElement;
  private shown = ''; // the fingerprint of what is drawn
  private timer = 0;
  private busy = false;
  private again = false;
  private histories = new Set<string>(); // the memories whose history a reader opened: a redraw keeps them open
  private list = h('div', { class: 'jp-wb-review-list', role: 'list', 'aria-label': 'Memories' });
  private info = h('div', { class: 'jp-wb-review-info', role: 'status', 'aria-live': 'polite' });
  private onChanged = () => void this.refresh();

  private parts: MemoryParts;

  constructor(
    private api: WorkbenchApi,
    private ctx: IReviewContext = {}
  ) {
    super();
    this.parts = new MemoryParts(api, ctx);
    this.id = 'jp-workbench-review';
    this.addClass('jp-wb-review');
    this.title.label = 'Memory review';
    this.title.caption = 'Review the memories dreams proposed';
    this.title.closable = true;
    const select = h(
      'select',
      {
        class: 'jp-wb-review-status jp-mod-styled',
        'aria-label': 'Show memories with this status',
        onchange: () => {
          this.status = select.value as (typeof STATUSES)[number];
          void this.refresh(true);
        }
      },
      ...STATUSES.map(s => h('option', { value: s }, s))
    );
    const search = h('input', {
      class: 'jp-wb-review-search',
      type: 'search',
      placeholder: 'Search title and text',
      'aria-label': 'Search memories',
      oninput: () => {
        this.search = search.value;
        void this.refresh(true);
      }
    });
    this.node.append(
      h(
        'header',
        { class: 'jp-wb-review-head' },
        h('h2', {}, 'Memory review'),
        select,
        this.storeSelect,
        search,
        this.info
      ),
      this.list
    );
  }

  protected onAfterAttach(): void {
    window.addEventListener(MEMORIES_CHANGED, this.onChanged);
    this.timer = window.setInterval(() => this.isVisible && void this.refresh(), POLL_MS);
    void this.refresh(true);
  }

  protected onBeforeDetach(): void {
    window.removeEventListener(MEMORIES_CHANGED, this.onChanged);
    window.clearInterval(this.timer);
  }

  dispose(): void {
    window.removeEventListener(MEMORIES_CHANGED, this.onChanged);
    window.clearInterval(this.timer);
    super.dispose();
  }

  /** Look again; redraw when anything shown changed (or `force`). One look at a time. */
  async refresh(force = false): Promise<void> {
    if (this.busy) {
      this.again = true; // look again (and redraw) once this look is done
      return;
    }
    this.busy = true;
    try {
      const params = new URLSearchParams();
      if (this.status !== 'all') {
        params.set('status', this.status);
      }
      if (this.search.trim()) {
        params.set('search', this.search.trim());
      }
      if (this.store) {
        params.set('store', this.store);
      }
      const body = await this.api.request<{ memories: IMemory[] }>(`memories?${params.toString()}`);
      const memories = (body.memories || []).slice().reverse(); // newest first
      this.noteStores(memories);
      const print = JSON.stringify(memories.map(m => [m.id, m.status, m.version, m.updated_at]));
      const editing = this.list.querySelector('.jp-wb-review-editor');
      if ((force || print !== this.shown) && !editing) {
        this.shown = print;
        this.draw(memories);
      }
      this.info.textContent = `${memories.length} ${this.status === 'all' ? '' : this.status + ' '}· updated ${new Date().toLocaleTimeString()}`;
      this.node.dataset.fingerprint = String(memories.length);
    } catch (err) {
      this.info.textContent = String((err as Error).message || err);
    } finally {
      this.busy = false;
      if (this.again) {
        this.again = false;
        void this.refresh(true);
      }
    }
  }

  /** The store filter lists every store seen so far; it shows once there are two. */
  private noteStores(memories: IMemory[]): void {
    const before = this.stores.size;
    for (const m of memories) {
      if (typeof m.store === 'string' && m.store) {
        this.stores.add(m.store);
      }
    }
    if (this.stores.size !== before || !this.storeSelect.options.length) {
      const names = Array.from(this.stores).sort();
      this.storeSelect.replaceChildren(
        h('option', { value: '' }, 'all stores'),
        ...names.map(n => h('option', { value: n }, n))
      );
      this.storeSelect.value = this.store;
    }
    this.storeSelect.hidden = this.stores.size < 2 && !this.store;
  }

  private draw(memories: IMemory[]): void {
    if (!memories.length) {
      this.list.replaceChildren(
        h(
          'p',
          { class: 'jp-wb-empty' },
          this.status === 'proposed'
            ? 'No proposals waiting for review. Dreams propose memories from past sessions.'
            : 'No memories here.'
        )
      );
      return;
    }
    // a redraw (a poll, a filter, an action elsewhere) keeps the provenance a reader opened open
    const open = new Set(
      Array.from(this.list.querySelectorAll<HTMLElement>('.jp-wb-review-card'))
        .filter(c => c.querySelector('details.jp-wb-review-provenance[open]'))
        .map(c => c.dataset.memoryId)
    );
    this.ctx.render?.clear(); // the cards drawn before, and their renderers, go
    this.list.replaceChildren(...memories.map(m => this.card(m)));
    for (const c of Array.from(this.list.querySelectorAll<HTMLElement>('.jp-wb-review-card'))) {
      const details = c.querySelector<HTMLDetailsElement>('details.jp-wb-review-provenance');
      if (details && open.has(c.dataset.memoryId)) {
        details.open = true;
      }
    }
    // and the histories a reader opened (asked again: an action may have added a version)
    for (const m of memories) {
      if (this.histories.has(m.id)) {
        const card = this.list.querySelector<HTMLElement>(`.jp-wb-review-card[data-memory-id="${CSS.escape(m.id)}"]`);
        const box = card?.querySelector<HTMLElement>('.jp-wb-review-history');
        const button = card?.querySelector<HTMLElement>('.jp-wb-review-history-toggle');
        if (box && button) {
          void this.showHistory(m, box, button);
        }
      }
    }
  }

  private card(m: IMemory): HTMLElement {
    const actions = h('div', { class: 'jp-wb-memory-actions' });
    const history = h('div', { class: 'jp-wb-review-history', hidden: true });
    const card = h(
      'article',
      {
        class: 'jp-wb-review-card',
        role: 'listitem',
        'data-memory-id': m.id,
        'data-status': m.status || '',
        'data-store': m.store || ''
      },
      h(
        'div',
        { class: 'jp-wb-review-title' },
        h('span', { class: `jp-wb-chip jp-wb-chip-${m.status || 'unknown'}` }, m.status || '?'),
        h('h3', {}, m.title || m.id),
        m.store &&
          this.stores.size > 1 &&
          h('span', { class: 'jp-wb-chip jp-wb-chip-store', title: 'the store it is in' }, m.store),
        h(
          'span',
          { class: 'jp-wb-meta', title: `${m.updated_by || ''} · ${when(m.updated_at || '')}` },
          `v${m.version ?? 1} · ${who(m.updated_by, this.me)} · ${m.updated_at ? ago(m.updated_at) : ''}`
        )
      ),
      m.proposal &&
        m.proposal !== 'create' &&
        h(
          'div',
          { class: 'jp-wb-meta' },
          `proposed: ${m.proposal}${m.targets?.length ? ` of ${m.targets.join(', ')}` : ''}`
        ),
      this.parts.text(m.text || ''),
      (m.tags || []).length > 0 &&
        h(
          'div',
          { class: 'jp-wb-review-tags' },
          ...(m.tags || []).map(t => h('span', { class: 'jp-wb-tag' }, t))
        ),
      (m.provenance || []).length > 0 &&
        h(
          'details',
          { class: 'jp-wb-review-provenance' },
          h('summary', {}, `Provenance: ${(m.provenance || []).length} source(s)`),
          h(
            'ul',
            {},
            ...(m.provenance || []).map((p: any) =>
              h(
                'li',
                {},
                this.parts.source(p),
                p.quote ? h('blockquote', {}, String(p.quote)) : null
              )
            )
          )
        ),
      actions,
      history
    );
    for (const action of ACTIONS[m.status || ''] || []) {
      actions.append(
        h(
          'button',
          {
            class: `jp-wb-button ${action === 'accept' ? 'jp-mod-accept' : action === 'edit' ? '' : 'jp-wb-danger'}`,
            'aria-label': `${LABELS[action]} ${m.title || m.id}`,
            onclick: () => (action === 'edit' ? this.edit(card, m) : void this.act(m, action))
          },
          LABELS[action]
        )
      );
    }
    actions.append(
      h(
        'button',
        {
          class: 'jp-wb-link jp-wb-review-history-toggle',
          'aria-expanded': 'false',
          onclick: (e: Event) => void this.toggleHistory(m, history, e.currentTarget as HTMLElement)
        },
        'History'
      )
    );
    return card;
  }

  private get me(): User.IIdentity | null {
    return this.ctx.user?.identity ?? null;
  }

  private async act(
    m: IMemory,
    action: Action,
    fields: Record<string, string> = {}
  ): Promise<void> {
    try {
      await this.api.request(`memories/${encodeURIComponent(m.id)}`, {
        method: 'PATCH',
        body: JSON.stringify({ action, ...fields })
      });
      memoriesChanged(); // the sidebar, and this panel, look again
    } catch (err) {
      this.info.textContent = `${LABELS[action]} failed: ${(err as Error).message || err}`;
    }
  }

  private edit(card: HTMLElement, m: IMemory): void {
    if (card.querySelector('.jp-wb-review-editor')) {
      return;
    }
    const area = h('textarea', {
      class: 'jp-wb-input',
      rows: 4,
      'aria-label': `New text of ${m.title || m.id}`
    });
    area.value = m.text || '';
    const editor = h(
      'div',
      { class: 'jp-wb-review-editor' },
      area,
      h(
        'div',
        { class: 'jp-wb-memory-actions' },
        h(
          'button',
          {
            class: 'jp-wb-button jp-mod-accept',
            onclick: async () => {
              editor.remove();
              await this.act(m, 'edit', { text: area.value });
            }
          },
          'Save'
        ),
        h(
          'button',
          {
            class: 'jp-wb-button',
            onclick: () => {
              editor.remove();
              void this.refresh(true);
            }
          },
          'Cancel'
        )
      )
    );
    card.append(editor);
    area.focus();
  }

  private async toggleHistory(m: IMemory, box: HTMLElement, button: HTMLElement): Promise<void> {
    if (this.histories.has(m.id)) {
      this.histories.delete(m.id);
      box.hidden = true;
      button.setAttribute('aria-expanded', 'false');
      return;
    }
    this.histories.add(m.id); // open from now: a redraw while it is asked for opens it on the new card
    await this.showHistory(m, box, button);
  }

  private async showHistory(m: IMemory, box: HTMLElement, button: HTMLElement): Promise<void> {
    try {
      const full = await this.api.request<IMemory>(`memories/${encodeURIComponent(m.id)}`);
      const versions: any[] = full.history || [];
      box.replaceChildren(
        h(
          'ol',
          {},
          ...versions.map(v =>
            h(
              'li',
              {},
              h(
                'span',
                { class: 'jp-wb-meta', title: String(v.actor || '') },
                `v${v.version} · ${v.action || v.status || ''} · ${who(v.actor, this.me)} · ${when(v.ts || v.at || '')}`
              ),
              v.text ? this.parts.text(String(v.text)) : null
            )
          )
        )
      );
    } catch (err) {
      box.replaceChildren(h('span', {}, String((err as Error).message || err)));
    }
    if (!this.histories.has(m.id)) {
      return; // closed while it was asked for
    }
    box.hidden = false;
    button.setAttribute('aria-expanded', 'true');
  }
}
