// A session's chat in a main-area tab (as jupyter-ai 3 opens one): the sidebar's chat component
// (ChatLog drawing with ChatRenderer) at the width of the main area, where plots and code have room.
// It follows the session's event stream as the sidebar does, so a message sent from either shows in
// both; one tab per session, restored on reload by JupyterLab's layout restorer (index.ts).
import { Widget } from '@lumino/widgets';

import { ApiError, IHands, ISession, StreamMessage, WorkbenchApi } from './api';
import { ChatLog, unsandboxed } from './chat';
import { h } from './dom';
import { ChatRenderer, IRenderContext } from './render';

/** The command that opens a session's chat in the main area (args: id; none: the sidebar's session). */
export const OPEN_CHAT_TAB = 'workbench:open-chat-tab';

// Committed events after which the hands' status is worth fetching again (as the sidebar does).
const HANDS_EVENTS = new Set([
  'hands_started',
  'hands_restarted',
  'hands_died',
  'hands_stopped',
  'tool_result'
]);

/** The hands' status in one line: "hands idle · gen 2 · pid 1234". */
export function handsText(hands: IHands): string {
  const parts = [`hands ${hands.state ?? 'unknown'}`];
  const isolation = unsandboxed(hands.backend);
  if (isolation) {
    parts.push(isolation);
  }
  if (hands.generation) {
    parts.push(`gen ${hands.generation}`);
  }
  if (hands.pid) {
    parts.push(`pid ${hands.pid}`);
  }
  return parts.join(' · ');
}

/** One session's chat: a one-line header (title, hands, Stop), the log, and a composer. */
export class SessionChatView extends Widget {
  readonly sessionId: string;
  /** Called with the session's title whenever it is (re)read: the tab's label follows it. */
  onTitle: (title: string) => void = () => undefined;
  private log: ChatLog;
  private ws: WebSocket | null = null;
  private streamOpen: Promise<void> = Promise.resolve();
  private running = false;
  /** The session was found: until then (and for an id that names none) nothing is sent or streamed. */
  private found = false;
  private started = false;
  private heading = h('span', { class: 'jp-wb-title' }, '');
  private handsLabel = h('span', { class: 'jp-wb-hands-label', role: 'status' }, '');
  private error = h('div', { class: 'jp-wb-banner', hidden: true });
  private input = h('textarea', {
    class: 'jp-wb-input',
    rows: 2,
    'aria-label': 'Message to the agent',
    title: 'Enter sends, Shift+Enter starts a new line, Esc stops the running turn',
    placeholder: 'Message the agent…'
  });
  private sendButton = h(
    'button',
    {
      class: 'jp-wb-button jp-mod-accept jp-wb-send',
      onclick: () => (this.running ? void this.interrupt() : void this.send())
    },
    'Send'
  );

  constructor(
    private api: WorkbenchApi,
    id: string,
    ctx: IRenderContext = {}
  ) {
    super();
    this.sessionId = id;
    this.addClass('jp-wb-chatarea');
    this.log = new ChatLog(new ChatRenderer(ctx), text => void this.retry(text));
    this.input.addEventListener('keydown', e => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        if (!this.running) {
          void this.send();
        }
      }
    });
    this.node.addEventListener('keydown', e => {
      if (e.key === 'Escape' && this.running) {
        e.preventDefault();
        e.stopPropagation();
        void this.interrupt();
      }
    });
    this.node.append(
      h('div', { class: 'jp-wb-session-head' }, this.heading, this.handsLabel),
      this.error,
      this.log.node,
      h('div', { class: 'jp-wb-composer' }, this.input, this.sendButton)
    );
    this.updateButtons();
  }

  protected onAfterAttach(): void {
    // once: a tab dragged to another place in the dock is detached and attached again
    if (!this.started) {
      this.started = true;
      void this.load();
    }
  }

  /** A tab restored behind another drew its log while hidden (no height to scroll): at the end once shown. */
  protected onAfterShow(): void {
    this.log.follow();
  }

  protected onResize(): void {
    this.log.follow();
  }

  protected onActivateRequest(): void {
    this.input.focus();
  }

  dispose(): void {
    const ws = this.ws;
    this.ws = null;
    ws?.close();
    this.log.dispose();
    super.dispose();
  }

  /** The session's title and state, then its events (the stream replays them from the start). */
  private async load(): Promise<void> {
    const session = await this.guard(() =>
      this.api.request<ISession>(`sessions/${encodeURIComponent(this.sessionId)}`)
    );
    if (!session || this.isDisposed) {
      return;
    }
    if (session.id !== this.sessionId) {
      // (an id from a saved workspace or a command's arguments is not trusted: it must name this session)
      this.error.textContent = 'This session no longer exists.';
      this.error.hidden = false;
      return;
    }
    this.found = true;
    this.showSession(session);
    this.running = !!session.running;
    this.updateButtons();
    this.openStream();
    void this.updateHands();
  }

  private showSession(s: ISession): void {
    const title = s.title || s.id;
    this.heading.textContent = `${title} · ${s.model}`;
    this.heading.title = `${title} · ${s.model} (${s.id})`;
    this.onTitle(title);
  }

  private openStream(): void {
    const ws = this.api.stream(this.sessionId, this.log.lastSeq, m => this.onStream(m));
    this.streamOpen = new Promise(resolve => {
      ws.addEventListener('open', () => resolve());
      ws.addEventListener('close', () => resolve());
    });
    // Reconnect after a drop: `after` makes sure nothing is missed or drawn twice.
    ws.onclose = () => {
      if (this.ws === ws && !this.isDisposed) {
        window.setTimeout(() => this.ws === ws && !this.isDisposed && this.openStream(), 1000);
      }
    };
    this.ws = ws;
  }

  private onStream(m: StreamMessage): void {
    if (m.kind === 'delta') {
      this.log.delta(m.event);
      return;
    }
    if (m.kind === 'output') {
      this.log.output(m);
      return;
    }
    const ev = m.event;
    this.log.event(ev);
    if (ev.type === 'user_message') {
      this.running = true;
    } else if (ev.type === 'turn_ended') {
      this.running = false;
      void this.refreshTitle(); // the first message may have named the session
    }
    if (HANDS_EVENTS.has(ev.type)) {
      void this.updateHands();
    }
    this.updateButtons();
  }

  private async refreshTitle(): Promise<void> {
    const s = await this.guard(() =>
      this.api.request<ISession>(`sessions/${encodeURIComponent(this.sessionId)}`)
    );
    if (s && !this.isDisposed) {
      this.showSession(s);
    }
  }

  private async updateHands(): Promise<void> {
    const hands = await this.guard(() => this.api.hands(this.sessionId));
    if (hands && !this.isDisposed) {
      const text = handsText(hands);
      this.handsLabel.textContent = text;
      this.handsLabel.title = text;
      this.handsLabel.dataset.state = String(hands.state ?? '');
      this.handsLabel.dataset.generation = String(hands.generation ?? '');
      this.handsLabel.classList.toggle('jp-wb-warn', unsandboxed(hands.backend) !== '');
    }
  }

  /** Send the composer's text as the session's next user message. */
  async send(text = this.input.value.trim(), fromComposer = true): Promise<void> {
    if (!text || this.running || !this.found) {
      return;
    }
    this.running = true;
    this.log.focus(0);
    this.updateButtons();
    await this.streamOpen; // live deltas are not stored: subscribed before the turn starts
    if (await this.guard(() => this.api.send(this.sessionId, text))) {
      if (fromComposer) {
        this.input.value = '';
      }
    } else {
      const s = await this.guard(() =>
        this.api.request<ISession>(`sessions/${encodeURIComponent(this.sessionId)}`)
      );
      this.running = !!s?.running;
      this.updateButtons();
    }
  }

  private async retry(text: string): Promise<void> {
    if (!this.running) {
      await this.send(text, false);
    }
  }

  async interrupt(): Promise<void> {
    if (!this.found) {
      return;
    }
    await this.guard(() => this.api.interrupt(this.sessionId));
  }

  private async guard<T>(fn: () => Promise<T>): Promise<T | undefined> {
    try {
      const result = await fn();
      this.error.hidden = true;
      return result;
    } catch (err) {
      this.error.textContent =
        err instanceof ApiError && err.status === 404
          ? 'This session no longer exists.'
          : String((err as Error).message || err);
      this.error.hidden = false;
      return undefined;
    }
  }

  private updateButtons(): void {
    const stop = this.running;
    this.sendButton.textContent = stop ? 'Stop' : 'Send';
    this.sendButton.title = stop ? 'Stop the running turn (Esc)' : 'Send the message (Enter)';
    this.sendButton.classList.toggle('jp-mod-accept', !stop);
    this.sendButton.classList.toggle('jp-wb-danger', stop);
    this.sendButton.disabled = !this.found;
    this.node.classList.toggle('jp-mod-running', stop);
  }
}
