// The conversation of one session, drawn from its committed events plus live model deltas.
import { IEvent } from './api';
import { h, imageSource, richText, stripAnsi } from './dom';

/** Renders a session's events into `node`; call `event()` and `delta()` as they arrive. */
export class ChatLog {
  readonly node = h('div', { class: 'jp-wb-log', role: 'log' });
  /** The highest committed seq drawn so far (the websocket's `after` on reconnect). */
  lastSeq = 0;
  private tools = new Map<string, HTMLElement>();
  private live: HTMLElement | null = null;
  private liveTargets: HTMLElement[] = [];

  clear(): void {
    this.node.replaceChildren();
    this.tools.clear();
    this.live = null;
    this.lastSeq = 0;
  }

  /** Draw one committed event (each seq once, in order). */
  event(ev: IEvent): void {
    if (ev.seq <= this.lastSeq) {
      return;
    }
    this.lastSeq = ev.seq;
    const p = ev.payload || {};
    switch (ev.type) {
      case 'user_message':
        this.add(h('div', { class: 'jp-wb-msg jp-wb-user' }, richText(p.text || '')));
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
          this.note(`hands: kernel generation ${p.generation} ready (${p.reason || 'started'})`);
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
      default:
        // session_created, model_request, egress and dream bookkeeping: visible in the log, not here.
        break;
    }
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
        msg.append(richText(block.text));
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
      card = h(
        'div',
        { class: 'jp-wb-tool', 'data-tool-use-id': id },
        h('div', { class: 'jp-wb-tool-head' }, name),
        h('pre', { class: 'jp-wb-code' }, code),
        h('div', { class: 'jp-wb-output' })
      );
      this.tools.set(id, card);
    }
    return card;
  }

  private toolResult(p: any): void {
    const card = this.attach(this.toolCard(p.tool_use_id, p.name, {}));
    card.classList.remove('jp-mod-running');
    card.classList.toggle('jp-mod-error', !!p.is_error);
    const out = card.querySelector('.jp-wb-output') as HTMLElement;
    out.replaceChildren();
    const obs = p.observation;
    if (!obs) {
      for (const block of p.content || []) {
        out.append(this.contentBlock(block));
      }
    } else {
      const stream = (text: string, cls: string) =>
        text && out.append(h('pre', { class: cls }, stripAnsi(text)));
      stream(obs.stdout, 'jp-wb-stdout');
      stream(obs.stderr, 'jp-wb-stderr');
      for (const bundle of [obs.result, ...(obs.displays || [])]) {
        if (bundle) {
          out.append(this.mimeBundle(bundle));
        }
      }
      if (obs.error) {
        const tb = (obs.error.traceback || []).map(stripAnsi).join('\n');
        stream(tb || `${obs.error.ename}: ${obs.error.evalue}`, 'jp-wb-stderr');
      }
    }
    this.scroll();
  }

  private mimeBundle(bundle: any): HTMLElement {
    const data = bundle.data || bundle;
    for (const mime of ['image/png', 'image/jpeg', 'image/gif']) {
      const src = data[mime] && imageSource(mime, data[mime]);
      if (src) {
        return h('img', { class: 'jp-wb-image', src });
      }
    }
    // An SVG as an <img> is a picture only: no script of it runs, nothing of it reaches the page.
    if (typeof data['image/svg+xml'] === 'string') {
      return h('img', {
        class: 'jp-wb-image',
        src: `data:image/svg+xml;charset=utf-8,${encodeURIComponent(data['image/svg+xml'])}`
      });
    }
    return h('pre', { class: 'jp-wb-stdout' }, String(data['text/plain'] ?? JSON.stringify(data)));
  }

  private contentBlock(block: any): HTMLElement {
    const src = block.type === 'image' && imageSource(block.source?.media_type, block.source?.data);
    if (src) {
      return h('img', { class: 'jp-wb-image', src });
    }
    return h('pre', { class: 'jp-wb-stdout' }, block.text ?? JSON.stringify(block));
  }

  private attach(card: HTMLElement): HTMLElement {
    return card.isConnected ? card : this.add(card);
  }

  private note(text: string, cls = ''): void {
    this.add(h('div', { class: `jp-wb-note ${cls}` }, text));
  }

  private dropLive(): void {
    this.live?.remove();
    this.live = null;
  }

  private add<T extends HTMLElement>(el: T): T {
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
    this.node.scrollTop = this.node.scrollHeight;
  }
}
