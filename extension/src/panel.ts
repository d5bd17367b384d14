// The workbench sidebar: sessions, the selected session's chat and hands, and the Memories tab.
import { Widget } from '@lumino/widgets';

import { ApiError, IEvent, IHands, ISession, StreamMessage, WorkbenchApi } from './api';
import { ChatLog } from './chat';
import { ago, h } from './dom';
import { MemoriesView } from './memories';

// Committed events after which the hands' status is worth fetching again.
const HANDS_EVENTS = new Set([
  'hands_started',
  'hands_restarted',
  'hands_died',
  'hands_stopped',
  'tool_result'
]);

export class WorkbenchPanel extends Widget {
  private api: WorkbenchApi;
  private log = new ChatLog();
  private memories: MemoriesView;
  private current: ISession | null = null;
  private ws: WebSocket | null = null;
  private streamOpen: Promise<void> = Promise.resolve();
  private running = false;
  private timer = 0;

  private list = h('ul', { class: 'jp-wb-sessions', role: 'listbox', 'aria-label': 'Sessions' });
  private heading = h('div', { class: 'jp-wb-title' }, 'No session selected');
  private handsLabel = h('span', { class: 'jp-wb-hands-label' }, '');
  private restartButton = h(
    'button',
    {
      class: 'jp-wb-button',
      title: 'Replace the kernel with a fresh one',
      onclick: () => this.restartHands()
    },
    'Restart hands'
  );
  private interruptButton = h(
    'button',
    {
      class: 'jp-wb-button jp-wb-danger',
      title: 'Stop the running turn',
      onclick: () => this.interrupt()
    },
    'Interrupt'
  );
  private input = h('textarea', {
    class: 'jp-wb-input',
    rows: 3,
    placeholder: 'Message the agent (Enter to send, Shift+Enter for a new line)'
  });
  private sendButton = h(
    'button',
    { class: 'jp-wb-button jp-mod-accept', onclick: () => this.send() },
    'Send'
  );
  private error = h('div', { class: 'jp-wb-banner', hidden: true });
  private chatTab = h('section', { class: 'jp-wb-tab' });
  private tabButtons: HTMLButtonElement[] = [];

  constructor(api: WorkbenchApi, openReview: () => void) {
    super();
    this.api = api;
    this.id = 'jp-workbench';
    this.addClass('jp-wb-panel');
    this.memories = new MemoriesView(api, openReview);
    this.input.addEventListener('keydown', e => {
      if (e.key === 'Enter' && !e.shiftKey) {
        e.preventDefault();
        void this.send();
      }
    });
    this.chatTab.append(
      h(
        'div',
        { class: 'jp-wb-section-head' },
        h('span', {}, 'Sessions'),
        h(
          'button',
          { class: 'jp-wb-button', title: 'Start a new session', onclick: () => this.newSession() },
          '+ New session'
        )
      ),
      this.list,
      h(
        'div',
        { class: 'jp-wb-session-head' },
        this.heading,
        h(
          'div',
          { class: 'jp-wb-hands' },
          this.handsLabel,
          this.restartButton,
          this.interruptButton
        )
      ),
      this.log.node,
      h('div', { class: 'jp-wb-composer' }, this.input, this.sendButton)
    );
    const tabs = h('nav', { class: 'jp-wb-tabs', role: 'tablist' });
    for (const [name, el] of [
      ['Chat', this.chatTab],
      ['Memories', this.memories.node]
    ] as const) {
      const button = h(
        'button',
        { class: 'jp-wb-tabbutton', role: 'tab', onclick: () => this.showTab(button, el) },
        name
      );
      this.tabButtons.push(button);
      tabs.append(button);
    }
    this.node.append(tabs, this.error, this.chatTab, this.memories.node);
    this.showTab(this.tabButtons[0], this.chatTab);
    this.updateButtons();
  }

  protected onAfterAttach(): void {
    void this.refresh();
    // The session list also changes from notebooks and the CLI: keep it fresh while shown.
    this.timer = window.setInterval(() => this.isVisible && void this.refresh(), 5000);
  }

  protected onBeforeDetach(): void {
    window.clearInterval(this.timer);
  }

  dispose(): void {
    window.clearInterval(this.timer);
    this.closeStream();
    super.dispose();
  }

  private showTab(button: HTMLButtonElement, el: HTMLElement): void {
    for (const b of this.tabButtons) {
      b.classList.toggle('jp-mod-active', b === button);
      b.setAttribute('aria-selected', String(b === button));
    }
    this.chatTab.hidden = el !== this.chatTab;
    this.memories.node.hidden = el !== this.memories.node;
    if (el === this.memories.node) {
      void this.memories.refresh();
    }
  }

  /** Run an API call, showing its error (one line) in the banner. */
  private async guard<T>(fn: () => Promise<T>): Promise<T | undefined> {
    try {
      const result = await fn();
      this.error.hidden = true;
      return result;
    } catch (err) {
      const status = err instanceof ApiError ? err.status : 0;
      this.error.textContent =
        status === 404 && !this.current
          ? 'The workbench server extension is not running on this server.'
          : String((err as Error).message || err);
      this.error.hidden = false;
      return undefined;
    }
  }

  async refresh(): Promise<void> {
    const sessions = await this.guard(() => this.api.sessions());
    if (!sessions) {
      return;
    }
    const chats = sessions.filter(s => s.kind !== 'dream').reverse();
    this.list.replaceChildren(
      ...chats.map(s =>
        h(
          'li',
          {
            class: `jp-wb-session${s.id === this.current?.id ? ' jp-mod-selected' : ''}`,
            role: 'option',
            'data-session-id': s.id,
            title: s.id,
            onclick: () => this.select(s)
          },
          h('span', { class: `jp-wb-dot${s.running ? ' jp-mod-running' : ''}` }),
          h('span', { class: 'jp-wb-session-title' }, s.title || s.id),
          h('span', { class: 'jp-wb-meta' }, `${s.model} · ${ago(s.updated_at)}`)
        )
      )
    );
    if (!chats.length) {
      this.list.append(
        h('li', { class: 'jp-wb-empty' }, 'No sessions yet. Start one with + New session.')
      );
    }
  }

  private async newSession(): Promise<void> {
    const session = await this.guard(() =>
      this.api.createSession({ title: `Chat ${new Date().toLocaleTimeString()}` })
    );
    if (session) {
      await this.select(session);
      await this.refresh();
      this.input.focus();
    }
  }

  async select(session: ISession): Promise<void> {
    this.closeStream();
    this.current = session;
    this.running = session.running;
    this.heading.textContent = `${session.title || session.id} · ${session.model}`;
    this.log.clear();
    for (const li of this.list.querySelectorAll('li')) {
      li.classList.toggle('jp-mod-selected', li.getAttribute('data-session-id') === session.id);
    }
    this.openStream();
    this.updateButtons();
    await this.updateHands();
  }

  private openStream(): void {
    const session = this.current;
    if (!session) {
      return;
    }
    const ws = this.api.stream(session.id, this.log.lastSeq, m => this.onStream(m));
    this.streamOpen = new Promise(resolve => {
      ws.addEventListener('open', () => resolve());
      ws.addEventListener('close', () => resolve());
    });
    // Reconnect after a drop: `after` makes sure nothing is missed or drawn twice.
    ws.onclose = () => {
      if (this.ws === ws && !this.isDisposed) {
        window.setTimeout(() => this.ws === ws && this.openStream(), 1000);
      }
    };
    this.ws = ws;
  }

  private closeStream(): void {
    const ws = this.ws;
    this.ws = null;
    ws?.close();
  }

  private onStream(m: StreamMessage): void {
    if (m.kind === 'delta') {
      this.log.delta(m.event);
      return;
    }
    const ev: IEvent = m.event;
    this.log.event(ev);
    if (ev.type === 'user_message') {
      this.running = true;
    } else if (ev.type === 'turn_ended') {
      this.running = false;
      void this.refresh();
    }
    if (HANDS_EVENTS.has(ev.type)) {
      void this.updateHands();
    }
    this.updateButtons();
  }

  private async updateHands(): Promise<void> {
    const id = this.current?.id;
    if (!id) {
      return;
    }
    const hands = await this.guard(() => this.api.hands(id));
    if (hands && id === this.current?.id) {
      this.showHands(hands);
    }
  }

  private showHands(hands: IHands): void {
    const parts = [`hands ${hands.state ?? 'unknown'}`];
    if (hands.generation) {
      parts.push(`gen ${hands.generation}`);
    }
    if (hands.pid) {
      parts.push(`pid ${hands.pid}`);
    }
    this.handsLabel.textContent = parts.join(' · ');
    this.handsLabel.dataset.generation = String(hands.generation ?? '');
    this.handsLabel.dataset.state = String(hands.state ?? '');
  }

  private async send(): Promise<void> {
    const text = this.input.value.trim();
    if (!text) {
      return;
    }
    if (!this.current) {
      await this.newSession();
    }
    const id = this.current?.id;
    if (!id) {
      return;
    }
    // Busy from now on; the stream's turn_ended (which may beat the POST's answer) ends it.
    this.running = true;
    this.updateButtons();
    // Live deltas are not stored: subscribe before the turn starts, or its streaming is missed.
    await this.streamOpen;
    if (await this.guard(() => this.api.send(id, text))) {
      this.input.value = '';
    } else {
      this.running = false;
      this.updateButtons();
    }
  }

  private async interrupt(): Promise<void> {
    const id = this.current?.id;
    if (id) {
      await this.guard(() => this.api.interrupt(id));
    }
  }

  private async restartHands(): Promise<void> {
    const id = this.current?.id;
    if (!id) {
      return;
    }
    this.restartButton.disabled = true;
    this.handsLabel.textContent = 'hands restarting…';
    const hands = await this.guard(() => this.api.restartHands(id));
    if (hands) {
      this.showHands(hands);
    } else {
      await this.updateHands();
    }
    this.updateButtons();
  }

  private updateButtons(): void {
    const selected = !!this.current;
    this.restartButton.disabled = !selected;
    this.interruptButton.disabled = !selected || !this.running;
    this.sendButton.disabled = this.running;
  }
}
