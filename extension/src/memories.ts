// The Memories tab: proposals from dreams waiting for a person's accept or reject. A memory's text is Markdown,
// rendered as the review panel renders it; each source is a link that opens its session at the cited event.
import { ApiError, IConflict, IMemory, WorkbenchApi } from './api';
import { h } from './dom';
import { IReviewContext, MEMORIES_CHANGED, MemoryParts, memoriesChanged } from './review';

export class MemoriesView {
  readonly node = h('section', { class: 'jp-wb-tab jp-wb-memories' });
  private list = h('div', { class: 'jp-wb-memory-list' });
  private status = h('div', { class: 'jp-wb-empty' });
  private parts: MemoryParts;

  constructor(
    private api: WorkbenchApi,
    openReview: () => void,
    ctx: IReviewContext = {}
  ) {
    this.parts = new MemoryParts(api, ctx);
    // a review in the main-area panel (or elsewhere on this page): look again
    window.addEventListener(MEMORIES_CHANGED, () => !this.node.hidden && void this.refresh());
    this.node.append(
      h(
        'div',
        { class: 'jp-wb-section-head' },
        h('span', {}, 'Proposed memories'),
        h(
          'button',
          {
            class: 'jp-wb-link',
            title: 'All memories, provenance, history and edits, in the main area',
            onclick: openReview
          },
          'Open the full review panel'
        )
      ),
      this.status,
      this.list
    );
  }

  async refresh(): Promise<void> {
    let memories: IMemory[];
    try {
      memories = await this.api.memories('proposed');
    } catch (err) {
      // Without the memory routes (an older server) there is simply nothing to review.
      const missing = err instanceof ApiError && err.status === 404;
      this.show(
        [],
        missing ? 'Memories are not available on this server.' : String((err as Error).message)
      );
      return;
    }
    this.show(
      memories,
      'No proposals waiting for review. Dreams propose memories from past sessions.'
    );
  }

  private show(memories: IMemory[], empty: string): void {
    this.status.textContent = memories.length ? `${memories.length} waiting for review` : empty;
    this.list.replaceChildren(...memories.map(m => this.card(m)));
  }

  private card(m: IMemory): HTMLElement {
    const sources = (m.provenance || []).map(p => this.parts.source(p));
    const buttons = h('div', { class: 'jp-wb-memory-actions' });
    const card = h(
      'article',
      { class: 'jp-wb-memory', 'data-memory-id': m.id },
      h('div', { class: 'jp-wb-memory-title' }, m.title || m.id),
      m.proposal &&
        m.proposal !== 'create' &&
        h('div', { class: 'jp-wb-meta' }, `proposed: ${m.proposal}`),
      h('div', { class: 'jp-wb-memory-text' }, this.parts.text(m.text || '')),
      sources.length > 0 &&
        h(
          'div',
          { class: 'jp-wb-meta jp-wb-memory-sources' },
          'from ',
          ...sources.flatMap((link, i) => (i ? [', ', link] : [link]))
        ),
      ...(m.conflicts || []).map(c => this.conflict(m, c)),
      buttons
    );
    for (const action of ['accept', 'reject'] as const) {
      buttons.append(
        h(
          'button',
          {
            class: `jp-wb-button ${action === 'accept' ? 'jp-mod-accept' : 'jp-wb-danger'}`,
            onclick: async () => {
              try {
                await this.api.review(m.id, action);
                card.remove();
                memoriesChanged(); // the main-area review panel looks again at once
                await this.refresh();
              } catch (err) {
                this.status.textContent = String((err as Error).message);
              }
            }
          },
          action === 'accept' ? 'Accept' : 'Reject'
        )
      );
    }
    return card;
  }

  // A contradiction: the proposal and the memory it contradicts side by side, and why.
  private conflict(m: IMemory, c: IConflict): HTMLElement {
    const side = (id: string, status: string, date: string, title: string, text: string) =>
      h(
        'div',
        { class: 'jp-wb-conflict-side' },
        h('div', { class: 'jp-wb-meta' }, `${id} · ${status} · ${(date || '').slice(0, 10)}`),
        h('div', { class: 'jp-wb-memory-title' }, title),
        h('div', { class: 'jp-wb-memory-text' }, this.parts.text(text))
      );
    return h(
      'div',
      { class: 'jp-wb-conflict', 'data-conflict-id': c.id },
      h('div', { class: 'jp-wb-meta' }, 'Looks contradictory to an existing memory:'),
      h(
        'div',
        { class: 'jp-wb-conflict-pair' },
        side(m.id, m.status || '', m.updated_at || '', m.title || '', m.text || ''),
        side(c.id, c.status, c.updated_at, c.title, c.text)
      ),
      h('div', { class: 'jp-wb-meta' }, `why: ${c.why}`)
    );
  }
}
