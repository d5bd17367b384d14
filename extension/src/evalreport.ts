// An eval run's report as a JupyterLab main-area panel (docs/jupyterlab.md, "Evals"): per model the pass
// rate with its Wilson interval (errors counted apart, never in the rate), the paired comparison, cost
// and latency; the task x model grid, each attempt a mark that opens its transcript beside the grid,
// drawn by the sidebar's own chat (ChatLog with ChatRenderer) from the attempt's event stream.
// Every number comes from GET /evals/{id}/report, computed by the code the HTML report and the
// DataFrame helpers use: nothing is computed here but how to show it. Task and model names, reasons
// and transcripts come from the log and from kernels: they go in as text, never as HTML.
import { Widget } from '@lumino/widgets';

import {
  ApiError,
  IEvalAttempt,
  IEvalComparison,
  IEvalReport,
  IEvalSummary,
  StreamMessage,
  WorkbenchApi
} from './api';
import { ChatLog } from './chat';
import { h } from './dom';
import { ChatRenderer, IRenderContext } from './render';

/** The command that opens a run's report (args: run; none: a dialog lists the runs). */
export const OPEN_EVAL_REPORT = 'workbench:open-eval-report';

/** How often a running run's report is read again. */
const POLL_MS = 2000;
let views = 0; // each view's transcript heading has an id of its own (the section is labelled by it)

/** Each outcome's mark, word and class; an attempt with none is unfinished. */
const OUTCOMES: Record<string, { mark: string; word: string }> = {
  pass: { mark: '✓', word: 'pass' },
  fail: { mark: '✗', word: 'fail' },
  error: { mark: '⚠', word: 'error' }
};
const UNFINISHED = { mark: '…', word: 'unfinished' };

/** An attempt's outcome as the grid shows it (an outcome this page does not know reads as unfinished). */
export function outcomeOf(a: IEvalAttempt): { mark: string; word: string; key: string } {
  const o = typeof a.outcome === 'string' ? OUTCOMES[a.outcome] : undefined;
  return o ? { ...o, key: a.outcome! } : { ...UNFINISHED, key: 'unfinished' };
}

const num = (x: unknown): x is number => typeof x === 'number' && isFinite(x);
const pct = (x: unknown): string => (num(x) ? `${Math.round(x * 100)}%` : '–');
const signed = (x: unknown): string =>
  num(x) ? `${x > 0 ? '+' : x < 0 ? '−' : '±'}${Math.abs(Math.round(x * 100))}%` : '–';
const secs = (x: unknown): string => (num(x) ? `${x.toFixed(1)} s` : '–');
const count = (x: unknown): string => (num(x) ? x.toLocaleString('en-US') : '–');

/** Estimated dollars, or why there are none (a model the price table does not name). */
function dollars(s: IEvalSummary): string {
  return s.priced && num(s.cost) ? `$${s.cost.toFixed(4)}` : 'not priced';
}

/** The one-line words of an attempt: where it is in the run and how it ended. */
export function attemptLabel(a: IEvalAttempt): string {
  const tries = num(a.tries) && a.tries > 1 ? `, try ${a.tries}` : '';
  return `${a.task} · ${a.model} · epoch ${a.epoch}${tries}: ${outcomeOf(a).word}`;
}

function attemptTitle(a: IEvalAttempt): string {
  const parts = [attemptLabel(a)];
  if (a.reason) {
    parts.push(`ended: ${a.reason}`);
  }
  if (num(a.score)) {
    parts.push(`score ${a.score}`);
  }
  parts.push(
    `${count(a.turns)} turn(s), ${count(a.tool_calls)} call(s), ` +
      `${count(a.input_tokens)} in / ${count(a.output_tokens)} out tokens, ${secs(a.wall_s)}`
  );
  return parts.join('\n');
}

/** A table with a caption read by screen readers, column headers and rows of cells. */
function table(
  cls: string,
  caption: string,
  head: (string | [string, string])[],
  rows: HTMLElement[]
): HTMLElement {
  // in a box of its own that scrolls sideways: a wide table does not push the panel wider
  return h('div', { class: 'jp-wb-eval-scroll' }, tableOf(cls, caption, head, rows));
}

function tableOf(
  cls: string,
  caption: string,
  head: (string | [string, string])[],
  rows: HTMLElement[]
): HTMLTableElement {
  return h(
    'table',
    { class: `jp-wb-eval-table ${cls}` },
    h('caption', { class: 'jp-wb-eval-caption' }, caption),
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        ...head.map(c =>
          Array.isArray(c)
            ? h('th', { scope: 'col', title: c[1] }, c[0])
            : h('th', { scope: 'col' }, c)
        )
      )
    ),
    h('tbody', {}, ...rows)
  );
}

/** The pass rate per model: passes, failures and errors apart, and the Wilson interval. */
export function summaryTable(rows: IEvalSummary[]): HTMLElement {
  return table(
    'jp-wb-eval-summary',
    'Pass rate per model: passed / graded (errors are not graded), with its 95% Wilson interval',
    [
      'model',
      'passed',
      'failed',
      [
        'errors',
        'attempts cut off by something the model did not cause, after their retries: not in the rate'
      ],
      'pass rate',
      ['95% CI', 'Wilson score interval of the pass rate'],
      ['retried', 'errors tried again'],
      ['unfinished', 'attempts not finished yet']
    ],
    rows.map(s =>
      h(
        'tr',
        { 'data-model': s.model },
        h('th', { scope: 'row', class: 'jp-wb-eval-name' }, s.model),
        h('td', { 'data-col': 'passed' }, `${count(s.passed)}/${count(s.n)}`),
        h('td', { 'data-col': 'failed' }, count(s.failed)),
        h(
          'td',
          { 'data-col': 'errors', class: s.errors ? 'jp-wb-eval-errors' : '' },
          count(s.errors)
        ),
        h('td', { 'data-col': 'rate' }, pct(s.rate)),
        h('td', { 'data-col': 'ci' }, num(s.rate) ? `${pct(s.low)}–${pct(s.high)}` : '–'),
        h('td', { 'data-col': 'retried' }, count(s.retried)),
        h('td', { 'data-col': 'unfinished' }, count(s.unfinished))
      )
    )
  );
}

/** Cost and latency per model, over its finished attempts: tokens, estimated dollars, mean wall time. */
export function costTable(rows: IEvalSummary[]): HTMLElement {
  return table(
    'jp-wb-eval-cost',
    'Cost and latency per model, over its finished attempts (errors included)',
    [
      'model',
      'input tokens',
      'output tokens',
      ['cost', 'estimated from the price table; not priced: it names no price for this model'],
      ['mean time', 'mean wall time of an attempt, grading included']
    ],
    rows.map(s =>
      h(
        'tr',
        { 'data-model': s.model },
        h('th', { scope: 'row', class: 'jp-wb-eval-name' }, s.model),
        h('td', { 'data-col': 'input_tokens' }, count(s.input_tokens)),
        h('td', { 'data-col': 'output_tokens' }, count(s.output_tokens)),
        h('td', { 'data-col': 'cost' }, dollars(s)),
        h('td', { 'data-col': 'time' }, secs(s.mean_wall_s))
      )
    )
  );
}

/** Each model after the first against the first: B − A over their shared graded tasks, interval and verdict. */
export function comparisonTable(rows: IEvalComparison[]): HTMLElement {
  return table(
    'jp-wb-eval-paired',
    'Paired comparison over the tasks both models have graded attempts of',
    [
      'B − A',
      'pass rate',
      ['95% CI', 'percentile bootstrap over tasks, seed 0'],
      'tasks',
      ['p', 'exact two-sided sign test over the tasks won and lost'],
      ['verdict', 'the interval and the sign test must both exclude no difference']
    ],
    rows.map(c =>
      c.error !== undefined
        ? h('tr', {}, h('td', { colspan: 6, class: 'jp-wb-eval-note' }, String(c.error)))
        : h(
            'tr',
            {},
            h('th', { scope: 'row', class: 'jp-wb-eval-name' }, `${c.b} − ${c.a}`),
            h('td', {}, signed(c.estimate)),
            h('td', {}, `${signed(c.low)} to ${signed(c.high)}`),
            h('td', {}, `${count(c.n)} (${count(c.wins)} won, ${count(c.losses)} lost)`),
            h('td', {}, num(c.p) ? c.p.toPrecision(2) : '–'),
            h('td', { class: 'jp-wb-eval-verdict' }, String(c.verdict ?? ''))
          )
    )
  );
}

/** The report of one run: its tables and grid, and the transcript of the attempt picked in the grid. */
export class EvalReportView extends Widget {
  readonly runId: string;
  private heading = h('h2', {}, '');
  private status = h(
    'span',
    { class: 'jp-wb-eval-status', role: 'status', 'aria-live': 'polite' },
    ''
  );
  private error = h('div', { class: 'jp-wb-banner', role: 'alert', hidden: true });
  private main = h('div', { class: 'jp-wb-eval-main' });
  private transcriptHead = h(
    'h3',
    { class: 'jp-wb-eval-transcript-head', id: `jp-wb-eval-transcript-${++views}` },
    'Transcript'
  );
  private transcriptInfo = h(
    'p',
    { class: 'jp-wb-eval-note' },
    'Pick an attempt in the grid (✓ pass, ✗ fail, ⚠ error, … unfinished) to read its transcript here.'
  );
  private openButton = h(
    'button',
    {
      class: 'jp-wb-button',
      hidden: true,
      title: "Open this attempt's session in the Workbench sidebar",
      onclick: () => this.picked && this.openSession?.(this.picked.session_id)
    },
    'Open in the sidebar'
  );
  private log: ChatLog;
  private ws: WebSocket | null = null;
  private picked: IEvalAttempt | null = null;
  private report: IEvalReport | null = null;
  private timer = 0;
  private started = false;
  /** The same report drawn twice is not drawn again (a redraw would move the keyboard focus). */
  private drawn = '';
  /** Set by the plugin: opens a session in the sidebar's chat. */
  openSession: ((id: string) => void) | null = null;

  constructor(
    private api: WorkbenchApi,
    run: string,
    ctx: IRenderContext = {}
  ) {
    super();
    this.runId = run;
    this.addClass('jp-wb-evalreport');
    this.log = new ChatLog(new ChatRenderer(ctx));
    this.log.node.setAttribute('aria-label', 'Transcript of the picked attempt');
    this.heading.textContent = `Eval run ${run}`;
    this.node.append(
      h(
        'div',
        { class: 'jp-wb-eval-head' },
        this.heading,
        this.status,
        h(
          'button',
          {
            class: 'jp-wb-button',
            title: 'Read the report again',
            onclick: () => void this.refresh()
          },
          'Refresh'
        )
      ),
      this.error,
      h(
        'div',
        { class: 'jp-wb-eval-body' },
        this.main,
        h(
          'section',
          { class: 'jp-wb-eval-transcript', 'aria-labelledby': this.transcriptHead.id },
          h('div', { class: 'jp-wb-eval-transcript-bar' }, this.transcriptHead, this.openButton),
          this.transcriptInfo,
          this.log.node
        )
      )
    );
    this.node.tabIndex = -1;
  }

  protected onAfterAttach(): void {
    if (!this.started) {
      this.started = true;
      void this.refresh();
    }
  }

  protected onActivateRequest(): void {
    this.node.focus();
  }

  protected onAfterShow(): void {
    if (this.report?.state === 'running') {
      void this.refresh();
    }
  }

  dispose(): void {
    window.clearTimeout(this.timer);
    this.closeStream();
    super.dispose();
  }

  /** Read the report and draw it; while the run runs, again in a moment (only while the panel is shown). */
  async refresh(): Promise<void> {
    window.clearTimeout(this.timer);
    let report: IEvalReport | null = null;
    let gone = false;
    const t0 = performance.now();
    try {
      report = await this.api.evalReport(this.runId);
      this.error.hidden = true;
    } catch (err) {
      gone = err instanceof ApiError && err.status === 404;
      this.error.textContent = gone
        ? `There is no eval run ${this.runId} in this server's log.`
        : String((err as Error).message || err);
      this.error.hidden = false;
    }
    if (this.isDisposed) {
      return;
    }
    if (report) {
      this.draw(report);
    }
    // again while it runs, or after a failure to read it (the server restarting), not for a run that is not there
    if (report?.state === 'running' || (!report && !gone)) {
      // a big run's report takes the server a while to compute: never ask for more than a fifth of its time
      const took = performance.now() - t0;
      this.timer = window.setTimeout(
        () => (this.isVisible ? void this.refresh() : undefined),
        Math.max(POLL_MS, 4 * took)
      );
    }
  }

  private draw(report: IEvalReport): void {
    const key = JSON.stringify(report);
    if (key === this.drawn) {
      return;
    }
    this.drawn = key;
    this.report = report;
    const words = `${report.state} · ${report.finished}/${report.total} finished`;
    this.status.textContent = words;
    this.status.dataset.state = report.state;
    this.node.dataset.state = report.state;
    const focused = (document.activeElement as HTMLElement | null)?.dataset?.session;
    const parts: HTMLElement[] = [];
    if (report.error) {
      parts.push(
        h('p', { class: 'jp-wb-eval-note jp-wb-error' }, `The run failed: ${report.error}`)
      );
    }
    parts.push(
      h(
        'section',
        { class: 'jp-wb-eval-section' },
        h('h3', {}, 'Pass rate'),
        summaryTable(report.summary)
      )
    );
    parts.push(
      h(
        'section',
        { class: 'jp-wb-eval-section' },
        h('h3', {}, 'Cost and latency'),
        costTable(report.summary)
      )
    );
    if (report.comparisons.length) {
      parts.push(
        h(
          'section',
          { class: 'jp-wb-eval-section' },
          h('h3', {}, 'Paired comparison'),
          comparisonTable(report.comparisons)
        )
      );
    }
    parts.push(
      h(
        'section',
        { class: 'jp-wb-eval-section' },
        h('h3', {}, 'Tasks × models'),
        this.grid(report)
      )
    );
    this.main.replaceChildren(...parts);
    if (focused) {
      this.main.querySelector<HTMLElement>(`[data-session="${CSS.escape(focused)}"]`)?.focus();
    }
    // the picked attempt, as the report says it now (finished meanwhile, or tried again as a new session)
    const picked = this.picked;
    if (picked) {
      const now = report.results.find(
        r => r.task === picked.task && r.model === picked.model && r.epoch === picked.epoch
      );
      if (now && now.session_id !== picked.session_id) {
        this.pick(now);
      } else if (now) {
        this.picked = now;
        this.showPicked(now);
      }
    }
  }

  /** Tasks down, models across; each attempt (its latest try, one per epoch) a button that opens its transcript. */
  private grid(report: IEvalReport): HTMLElement {
    const cells = new Map<string, IEvalAttempt[]>();
    for (const r of report.results) {
      const key = JSON.stringify([r.task, r.model]);
      const list = cells.get(key) || [];
      list.push(r);
      cells.set(key, list);
    }
    const rows = report.tasks.map(task =>
      h(
        'tr',
        { 'data-task': task },
        h('th', { scope: 'row', class: 'jp-wb-eval-name' }, task),
        ...report.models.map(model => {
          const attempts = (cells.get(JSON.stringify([task, model])) || []).sort(
            (a, b) => a.epoch - b.epoch
          );
          return h(
            'td',
            { 'data-model': model },
            ...attempts.map(a => {
              const o = outcomeOf(a);
              const selected = this.picked?.session_id === a.session_id;
              return h(
                'button',
                {
                  class: `jp-wb-eval-mark jp-mod-${o.key}${selected ? ' jp-mod-selected' : ''}`,
                  'data-session': a.session_id,
                  'data-outcome': o.key,
                  'aria-label': attemptLabel(a),
                  'aria-pressed': String(selected),
                  title: attemptTitle(a),
                  onclick: () => this.pick(a)
                },
                o.mark
              );
            })
          );
        })
      )
    );
    return table(
      'jp-wb-eval-grid',
      'Each attempt by task and model; pick one to read its transcript',
      ['task', ...report.models],
      rows
    );
  }

  /** Show an attempt's transcript: its session's events from the start, then live while it runs. */
  pick(a: IEvalAttempt): void {
    const same = this.picked?.session_id === a.session_id && this.ws;
    this.picked = a;
    for (const b of this.main.querySelectorAll<HTMLElement>('.jp-wb-eval-mark')) {
      const on = b.dataset.session === a.session_id;
      b.classList.toggle('jp-mod-selected', on);
      b.setAttribute('aria-pressed', String(on));
    }
    this.showPicked(a);
    if (same) {
      return;
    }
    this.closeStream();
    this.log.clear();
    this.log.node.dataset.session = a.session_id;
    this.openStream(a.session_id);
  }

  private showPicked(a: IEvalAttempt): void {
    this.transcriptHead.textContent = attemptLabel(a);
    // how it ended is the transcript's last line; here what it took
    const parts = [
      a.outcome ? `${secs(a.wall_s)}` : 'not finished yet',
      `${count(a.turns)} turn${a.turns === 1 ? '' : 's'}`,
      `${count(a.tool_calls)} call${a.tool_calls === 1 ? '' : 's'}`,
      `${count(a.input_tokens)} in / ${count(a.output_tokens)} out tokens`
    ];
    if (num(a.score)) {
      parts.push(`score ${a.score}`);
    }
    parts.push(`session ${a.session_id}`);
    this.transcriptInfo.textContent = parts.join(' · ');
    this.openButton.hidden = !this.openSession;
  }

  private openStream(id: string): void {
    const ws = this.api.stream(id, this.log.lastSeq, m => this.onStream(id, m));
    ws.onclose = () => {
      // a drop (the server restarted): again from the last event drawn, while this attempt is still the one shown
      if (this.ws === ws && !this.isDisposed) {
        window.setTimeout(() => this.ws === ws && !this.isDisposed && this.openStream(id), 1000);
      }
    };
    this.ws = ws;
  }

  private onStream(id: string, m: StreamMessage): void {
    if (this.picked?.session_id !== id) {
      return;
    }
    if (m.kind === 'delta') {
      this.log.delta(m.event);
    } else if (m.kind === 'output') {
      this.log.output(m);
    } else {
      this.log.event(m.event);
    }
  }

  private closeStream(): void {
    const ws = this.ws;
    this.ws = null;
    ws?.close();
  }
}
