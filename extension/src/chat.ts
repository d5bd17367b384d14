// The conversation of one session, drawn from its committed events plus live model deltas.
import { IAttachment, IEvent, IOutput } from './api';
import { chip, replaceTarget } from './context';
import { h, imageSource, stripAnsi } from './dom';
import { ChatRenderer } from './render';

/** What the hands' launcher means for isolation, when it is not a sandbox of their own (said plainly). */
export function unsandboxed(launcher: string | undefined): string {
  if (launcher === 'container') {
    return 'not sandboxed: this container is their sandbox';
  }
  if (launcher === 'unsafe-local') {
    return 'NOT sandboxed (unsafe setting on)';
  }
  return '';
}

/** The latest characters of a running call's output a card keeps (the committed result replaces them). */
const LIVE_CHARS = 50000;

/** Renders a session's events into `node`; call `event()` and `delta()` as they arrive. */
export class ChatLog {
  readonly node = h('div', { class: 'jp-wb-log', role: 'log' });
  /** The highest committed seq drawn so far (the websocket's `after` on reconnect). */
  lastSeq = 0;
  private tools = new Map<string, HTMLElement>();
  private live: HTMLElement | null = null;
  private liveTargets: HTMLElement[] = [];

  /** The text of the latest user message drawn (what Retry sends again). */
  lastUserText = '';
  /** And its notebook context (docs/api.md, "Notebook context"), which Retry sends again with it. */
  lastUserAttachments: IAttachment[] = [];
  private retryButton: HTMLElement | null = null;
  /** The seq of the committed event being drawn: what it adds is marked with it (`data-seq`). */
  private drawing = 0;
  /** The event a reader opened the session at (a search hit, a memory's source): kept in view, not the end. */
  private focusSeq = 0;
  /** Whether the log was at its end when the reader last scrolled it (they did not scroll up to read). */
  private atEnd = true;
  private resize: ResizeObserver;
  private added: MutationObserver;

  /** `onRetry` re-sends a failed turn's user message (a Retry button after a turn that did not end well). */
  constructor(
    private render: ChatRenderer = new ChatRenderer(),
    private onRetry: ((text: string, attachments: IAttachment[]) => void) | null = null
  ) {
    // An output image fits the chat; a click shows it at its natural size (the output scrolls), another fits it again.
    this.node.addEventListener('click', e => {
      const img = (e.target as Element | null)?.closest?.('.jp-wb-mime img, img.jp-wb-image');
      if (img && this.node.contains(img)) {
        img.classList.toggle('jp-mod-full');
      }
    });
    // Only the reader's own scrolling (wheel, touch, keys, the scrollbar) decides whether the end stays
    // in view: a scroll the layout causes (a theme's styles swapped, a panel shown) does not.
    let byReader = 0;
    for (const kind of ['wheel', 'touchmove', 'keydown', 'pointerdown']) {
      this.node.addEventListener(kind, () => (byReader = Date.now()), { passive: true });
    }
    this.node.addEventListener('scroll', () => {
      const n = this.node;
      if (Date.now() - byReader < 1000 && n.clientHeight > 0) {
        this.atEnd = n.scrollTop + n.clientHeight >= n.scrollHeight - 8;
      }
    });
    // An image that finishes loading after it was drawn makes the log taller, and so do the log's box changing
    // size (shown, resized, restyled) and a message growing as its Markdown, code highlighting or outputs render
    // (asynchronously, after it was added): keep the end (or the focused event) in view.
    this.node.addEventListener('load', () => this.follow(), true);
    this.resize = new ResizeObserver(() => this.follow());
    this.resize.observe(this.node);
    this.added = new MutationObserver(records => {
      for (const r of records) {
        for (const el of r.addedNodes) {
          if (el instanceof Element) {
            this.resize.observe(el);
          }
        }
      }
    });
    this.added.observe(this.node, { childList: true });
  }

  /** After layout: the focused event, else the end unless the reader scrolled up (a panel shown or resized calls it). */
  follow(): void {
    requestAnimationFrame(() => this.scroll());
  }

  /** Stop following the log's size (the widget that shows it is disposed). */
  dispose(): void {
    this.resize.disconnect();
    this.added.disconnect();
  }

  clear(): void {
    this.render.clear();
    this.node.replaceChildren();
    this.lastUserText = '';
    this.lastUserAttachments = [];
    this.retryButton = null;
    this.tools.clear();
    this.live = null;
    this.lastSeq = 0;
    this.focusSeq = 0;
    this.atEnd = true;
  }

  /** Keep the event `seq` (or the last one drawn before it) outlined and in view, once it is drawn; 0 lets go
   * (and the end is followed again: a new turn starts). */
  focus(seq: number): void {
    this.focusSeq = seq;
    this.atEnd = this.atEnd || seq === 0;
    this.scroll();
  }

  /** Draw one committed event (each seq once, in order). */
  event(ev: IEvent): void {
    if (ev.seq <= this.lastSeq) {
      return;
    }
    this.lastSeq = ev.seq;
    this.drawing = ev.seq;
    try {
      this.draw(ev);
    } finally {
      this.drawing = 0;
    }
  }

  private draw(ev: IEvent): void {
    const p = ev.payload || {};
    switch (ev.type) {
      case 'user_message':
        this.lastUserText = String(p.text ?? '');
        this.lastUserAttachments = Array.isArray(p.attachments) ? p.attachments : [];
        this.retryButton?.remove();
        this.retryButton = null;
        // Rendered as a reply is (Markdown, LaTeX, code blocks with their actions), sanitized the same way;
        // its notebook context as chips that open to show what was sent. The reply's code may replace the
        // one cell it was about (Fix this error).
        this.render.target = null;
        this.add(
          h(
            'div',
            { class: 'jp-wb-msg jp-wb-user' },
            ...(Array.isArray(p.attachments) ? p.attachments.map((a: any) => chip(a)) : []),
            this.render.markdown(String(p.text ?? ''))
          )
        );
        this.render.target = replaceTarget(p.attachments);
        break;
      case 'assistant_turn':
        this.dropLive();
        this.add(this.assistant(p.message?.content || []));
        break;
      case 'tool_started':
        this.attach(this.toolCard(p.tool_use_id, p.name, p.input)).classList.add('jp-mod-running');
        break;
      case 'tool_result':
        this.toolResult(p);
        break;
      case 'turn_ended':
        this.dropLive();
        if (p.stop_reason !== 'end_turn') {
          this.note(`turn ended: ${p.stop_reason}`, 'jp-wb-warn');
          this.offerRetry();
        }
        break;
      case 'interrupted':
        this.note(`interrupted by ${p.by || 'user'}`, 'jp-wb-warn');
        break;
      case 'model_error':
        this.note(`model error: ${p.error}`, 'jp-wb-error');
        break;
      case 'model_retry':
        this.note(`model call failed (${p.error}); retrying in ${p.delay_s}s`, 'jp-wb-warn');
        break;
      case 'hands_started':
        // A restart on request has its own event (hands_restarted) below.
        if (p.reason !== 'restart') {
          const isolation = unsandboxed(p.launcher);
          this.note(
            `hands: kernel generation ${p.generation} ready (${p.reason || 'started'})` +
              (isolation ? ` · ${isolation}` : ''),
            isolation ? 'jp-wb-warn' : ''
          );
        }
        break;
      case 'hands_restarted':
        this.note(`hands restarted: generation ${p.generation}`);
        break;
      case 'hands_died':
        this.note(
          `hands died (${p.how || 'exit ' + p.exit_code}); its state is gone`,
          'jp-wb-error'
        );
        break;
      case 'hands_timeout':
        this.note(`hands timed out after ${p.timeout}s: ${p.action}`, 'jp-wb-warn');
        break;
      case 'hands_refused':
        this.note(`code not run: ${p.reason}. ${p.fix || ''}`, 'jp-wb-error');
        break;
      case 'memories_injected':
        this.note(`${(p.memories || []).length} memories in this session's prompt`);
        break;
      case 'resumed':
        this.note('resumed from the log');
        break;
      case 'delegate_checked':
        this.note(
          `check ${p.passed ? 'passed' : 'failed'}: ${String(p.explanation || '').slice(-300)}`,
          p.passed ? '' : 'jp-wb-warn'
        );
        break;
      case 'eval_started':
        this.note(
          `eval attempt: task ${p.task} · ${p.model} · epoch ${p.epoch}` +
            (Number(p.try) > 1 ? ` · try ${p.try}` : '')
        );
        break;
      case 'eval_verdict':
        // a failed verdict's explanation is also the next user message, when the budget allows another turn
        this.note(
          p.details?.error
            ? `no verdict after turn ${p.turn}: ${p.details.error}`
            : `verdict after turn ${p.turn}: ${p.passed ? 'passed' : 'failed'}` +
                (typeof p.score === 'number' ? ` (score ${p.score})` : '') +
                (p.explanation ? `: ${p.explanation}` : ''),
          p.details?.error ? 'jp-wb-error' : p.passed ? '' : 'jp-wb-warn'
        );
        break;
      case 'eval_finished':
        this.note(
          `attempt ended: ${p.outcome ?? (p.passed ? 'pass' : 'fail')} (${p.reason})`,
          p.outcome === 'error' ? 'jp-wb-error' : p.outcome === 'fail' ? 'jp-wb-warn' : ''
        );
        break;
      default:
        // session_created, model_request, egress and dream bookkeeping: visible in the log, not here.
        break;
    }
  }

  /** Draw a running call's live output in its card: the latest lines, the elapsed time, the hands' state. */
  output(m: IOutput): void {
    const card = this.attach(this.toolCard(m.tool_use_id, m.name, {}));
    if (!card.classList.contains('jp-mod-running') && card.dataset.done === '1') {
      return; // its committed result is drawn already
    }
    card.classList.add('jp-mod-running');
    const out = card.querySelector('.jp-wb-output') as HTMLElement;
    let status = out.querySelector('.jp-wb-live-status') as HTMLElement | null;
    let pre = out.querySelector('.jp-wb-live') as HTMLElement | null;
    if (!status || !pre) {
      status = h('div', { class: 'jp-wb-live-status' });
      pre = h('pre', { class: 'jp-wb-stdout jp-wb-live' });
      out.replaceChildren(status, pre);
    }
    let text = m.snapshot ? '' : pre.textContent || '';
    if (m.skipped) {
      text += `[… ${m.skipped.toLocaleString()} characters not shown live …]\n`;
    }
    text = (text + stripAnsi(m.text || '')).slice(-LIVE_CHARS);
    if (text !== pre.textContent) {
      pre.textContent = text;
    }
    const state = m.state === 'running' ? 'running' : 'finishing';
    status.textContent = `${state} · ${Math.round(m.elapsed_s)} s · hands ${m.hands}`;
    status.dataset.hands = m.hands;
    this.scroll();
  }

  /** Draw a live Messages API stream event (not stored; replaced by the committed turn). */
  delta(ev: any): void {
    if (ev.type === 'message_start') {
      this.dropLive();
      this.live = this.add(h('div', { class: 'jp-wb-msg jp-wb-assistant jp-mod-streaming' }));
      this.liveTargets = [];
      return;
    }
    if (!this.live) {
      return;
    }
    if (ev.type === 'content_block_start') {
      const kind = ev.content_block?.type;
      // Each block keeps the element its deltas are appended to.
      let block: HTMLElement;
      let target: HTMLElement;
      if (kind === 'thinking') {
        target = h('div', {});
        block = h('details', { class: 'jp-wb-thinking' }, h('summary', {}, 'Thinking…'), target);
      } else if (kind === 'tool_use') {
        target = h('pre', { class: 'jp-wb-code' });
        block = h(
          'div',
          { class: 'jp-wb-tool jp-mod-running' },
          h('div', { class: 'jp-wb-tool-head' }, ev.content_block.name),
          target
        );
      } else {
        block = target = h('div', { class: 'jp-wb-text' });
      }
      this.liveTargets[ev.index] = target;
      this.live.append(block);
    } else if (ev.type === 'content_block_delta') {
      const d = ev.delta || {};
      this.liveTargets[ev.index]?.append(d.text ?? d.thinking ?? d.partial_json ?? '');
      this.scroll();
    }
  }

  private assistant(content: any[]): HTMLElement {
    const msg = h('div', { class: 'jp-wb-msg jp-wb-assistant' });
    for (const block of content) {
      if (block.type === 'text' && block.text) {
        msg.append(this.render.markdown(block.text));
      } else if (block.type === 'thinking' || block.type === 'redacted_thinking') {
        const text = block.type === 'thinking' ? block.thinking : '(redacted)';
        if (text) {
          msg.append(
            h(
              'details',
              { class: 'jp-wb-thinking' },
              h('summary', {}, 'Thinking'),
              h('div', {}, text)
            )
          );
        }
      } else if (block.type === 'tool_use') {
        msg.append(this.toolCard(block.id, block.name, block.input));
      }
    }
    return msg;
  }

  /** The card of one tool call, created on first sight; attached to the log if it has no place yet. */
  private toolCard(id: string, name: string, input: any): HTMLElement {
    let card = this.tools.get(id);
    if (!card) {
      const code = typeof input?.code === 'string' ? input.code : JSON.stringify(input, null, 2);
      const pre =
        typeof input?.code === 'string'
          ? this.render.code(code, 'python')
          : h('pre', { class: 'jp-wb-code' }, code);
      card = h(
        'div',
        { class: 'jp-wb-tool', 'data-tool-use-id': id },
        h('div', { class: 'jp-wb-tool-head' }, name),
        pre,
        h('div', { class: 'jp-wb-output' })
      );
      if (typeof input?.code === 'string') {
        this.render.codeActions(pre, () => code);
      }
      this.tools.set(id, card);
    }
    return card;
  }

  private toolResult(p: any): void {
    const card = this.attach(this.toolCard(p.tool_use_id, p.name, {}));
    card.classList.remove('jp-mod-running');
    card.dataset.done = '1';
    card.classList.toggle('jp-mod-error', !!p.is_error);
    // cut short by Stop or an interrupt: what it printed until then stays, marked (docs/events.md)
    card.classList.toggle('jp-mod-interrupted', !!p.interrupted);
    const out = card.querySelector('.jp-wb-output') as HTMLElement;
    out.replaceChildren();
    const obs = p.observation;
    const hint = () =>
      obs?.hint && out.append(h('div', { class: 'jp-wb-hint', role: 'note' }, String(obs.hint)));
    if (!obs) {
      for (const block of p.content || []) {
        out.append(this.contentBlock(block));
      }
    } else {
      const stream = (text: string, cls: string) =>
        text && out.append(h('pre', { class: cls }, stripAnsi(text)));
      const error = (e: any) =>
        stream(
          (e.traceback || []).map(stripAnsi).join('\n') || `${e.ename}: ${e.evalue}`,
          'jp-wb-stderr'
        );
      if (Array.isArray(obs.outputs)) {
        // the call's outputs in their order, as the notebook showed them (see docs/events.md)
        for (const o of obs.outputs) {
          if (o?.output_type === 'stream') {
            stream(String(o.text ?? ''), o.name === 'stderr' ? 'jp-wb-stderr' : 'jp-wb-stdout');
          } else if (o?.output_type === 'error') {
            error(o);
          } else if (o?.output_type === 'set_next_input') {
            stream(String(o.text ?? ''), 'jp-wb-stdout');
          } else if (o?.data && typeof o.data === 'object') {
            out.append(this.render.bundle(o.data, o.metadata));
          }
        }
        // the error's own output is not among them when the call ended without one (an interrupt)
        if (obs.error && !obs.outputs.some((o: any) => o?.output_type === 'error')) {
          error(obs.error);
        }
        hint();
        this.scroll();
        return;
      }
      stream(obs.stdout, 'jp-wb-stdout');
      stream(obs.stderr, 'jp-wb-stderr');
      for (const bundle of [obs.result, ...(obs.displays || [])]) {
        if (bundle) {
          out.append(this.render.bundle(bundle));
        }
      }
      if (obs.error) {
        error(obs.error);
      }
      hint();
    }
    this.scroll();
  }

  private contentBlock(block: any): HTMLElement {
    const src = block.type === 'image' && imageSource(block.source?.media_type, block.source?.data);
    if (src) {
      return h('img', { class: 'jp-wb-image', src, alt: 'an image the tool returned' });
    }
    return h('pre', { class: 'jp-wb-stdout' }, block.text ?? JSON.stringify(block));
  }

  private attach(card: HTMLElement): HTMLElement {
    return card.isConnected ? card : this.add(card);
  }

  /** A Retry button under a turn that failed or was cut off: it sends the same message again. */
  private offerRetry(): void {
    const text = this.lastUserText;
    const attachments = this.lastUserAttachments;
    const retry = this.onRetry;
    if (!retry || !text) {
      return;
    }
    this.retryButton?.remove();
    this.retryButton = this.add(
      h(
        'button',
        {
          class: 'jp-wb-button jp-wb-retry',
          title: 'Send the same message again, as a new message',
          onclick: () => retry(text, attachments)
        },
        'Retry'
      )
    );
  }

  private note(text: string, cls = ''): void {
    this.add(h('div', { class: `jp-wb-note ${cls}` }, text));
  }

  private dropLive(): void {
    this.live?.remove();
    this.live = null;
  }

  private add<T extends HTMLElement>(el: T): T {
    if (this.drawing && !el.dataset.seq) {
      el.dataset.seq = String(this.drawing);
    }
    // Live text stays last, below anything committed meanwhile.
    if (this.live && this.live !== el) {
      this.node.insertBefore(el, this.live);
    } else {
      this.node.append(el);
    }
    this.scroll();
    return el;
  }

  private scroll(): void {
    const at = this.focusSeq ? this.drawnAt(this.focusSeq) : null;
    if (!at) {
      if (this.atEnd) {
        this.node.scrollTop = this.node.scrollHeight;
      }
      return;
    }
    if (!at.classList.contains('jp-wb-focused')) {
      this.node.querySelector('.jp-wb-focused')?.classList.remove('jp-wb-focused');
      at.classList.add('jp-wb-focused');
    }
    at.scrollIntoView({ block: 'center' });
  }

  /** The element drawn for event `seq`, or for the last event before it that drew one (a tool result fills a card). */
  private drawnAt(seq: number): HTMLElement | null {
    let found: HTMLElement | null = null;
    for (const el of this.node.querySelectorAll<HTMLElement>(':scope > [data-seq]')) {
      if (Number(el.dataset.seq) > seq) {
        break;
      }
      found = el;
    }
    return found;
  }
}
