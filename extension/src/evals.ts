// The sidebar's Evals tab: every eval run of the server's log, the running ones first, each with its
// progress (finished of all its attempts, and passes, failures and errors so far) and a button that opens
// its report in the main area (evalreport.ts). Read from GET /evals while the tab is shown: every few
// seconds while a run runs, less often otherwise. Run ids and model names come from the log: text only.
import { IEvalRun, WorkbenchApi } from './api';
import { ago, h } from './dom';

const POLL_RUNNING_MS = 2000;
const POLL_IDLE_MS = 10000;

/** The words of a run's progress: "3/10 finished · 2 passed · 1 failed · 0 errors". */
export function progressText(r: IEvalRun): string {
  return (
    `${r.finished}/${r.total} finished · ${r.passed} passed · ${r.failed} failed · ` +
    `${r.errors} error${r.errors === 1 ? '' : 's'}`
  );
}

/** A run's state in a word: a run this server does not run (`stopped`) reads as finished when all its attempts are. */
export function stateWord(r: IEvalRun): string {
  return r.state === 'stopped' && r.finished >= r.attempts ? 'finished' : r.state;
}

export class EvalsView {
  readonly node = h('section', { class: 'jp-wb-tab jp-wb-evals', 'aria-label': 'Eval runs' });
  private list = h('ul', { class: 'jp-wb-eval-runs', 'aria-label': 'Eval runs, running first' });
  // not the sidebar's .jp-wb-banner: the tab's own line (the sidebar's banner speaks for its chat)
  private error = h('div', { class: 'jp-wb-eval-error', role: 'alert', hidden: true });
  private timer = 0;
  private shown = false;
  private drawn = '';

  /** `open` opens a run's report in the main area; `visible` says whether the sidebar is shown (no reads while not). */
  constructor(
    private api: WorkbenchApi,
    private open: (run: string) => void,
    private visible: () => boolean = () => true
  ) {
    this.node.append(
      h(
        'div',
        { class: 'jp-wb-section-head' },
        h('span', {}, 'Eval runs'),
        h(
          'button',
          {
            class: 'jp-wb-button',
            title: 'Read the runs again',
            onclick: () => void this.refresh()
          },
          'Refresh'
        )
      ),
      this.error,
      this.list
    );
  }

  /** The tab was shown (true) or hidden: it reads the runs while shown, and stops when hidden. */
  setShown(shown: boolean): void {
    this.shown = shown;
    window.clearTimeout(this.timer);
    if (shown) {
      void this.refresh();
    }
  }

  dispose(): void {
    this.shown = false;
    window.clearTimeout(this.timer);
  }

  async refresh(): Promise<void> {
    window.clearTimeout(this.timer);
    let runs: IEvalRun[] | null = null;
    const t0 = performance.now();
    try {
      runs = await this.api.evalRuns();
      this.error.hidden = true;
    } catch (err) {
      this.error.textContent = String((err as Error).message || err);
      this.error.hidden = false;
    }
    if (runs) {
      this.draw(runs);
    }
    if (this.shown) {
      const running = !runs || runs.some(r => r.state === 'running');
      // a log of many runs takes the server a while to list: never ask for more than a fifth of its time
      const took = performance.now() - t0;
      this.later(Math.max(running ? POLL_RUNNING_MS : POLL_IDLE_MS, 4 * took));
    }
  }

  /** Read the runs again in `ms`, if the tab is still shown; while the sidebar is collapsed, look again later. */
  private later(ms: number): void {
    window.clearTimeout(this.timer);
    this.timer = window.setTimeout(() => {
      if (this.shown && this.visible()) {
        void this.refresh();
      } else if (this.shown) {
        this.later(ms);
      }
    }, ms);
  }

  private draw(runs: IEvalRun[]): void {
    const key = JSON.stringify(runs);
    if (key === this.drawn) {
      return; // the same runs: the list stays as it is (and the keyboard focus in it)
    }
    this.drawn = key;
    const focused = (document.activeElement as HTMLElement | null)?.dataset?.run;
    // running first, then the newest
    const ordered = [...runs].sort((a, b) =>
      (a.state === 'running') !== (b.state === 'running')
        ? a.state === 'running'
          ? -1
          : 1
        : a.started_at < b.started_at
          ? 1
          : a.started_at > b.started_at
            ? -1
            : 0
    );
    this.list.replaceChildren(
      ...ordered.map(r => {
        const words = progressText(r);
        return h(
          'li',
          { class: 'jp-wb-eval-run', 'data-run': r.run, 'data-state': r.state },
          h(
            'div',
            { class: 'jp-wb-eval-run-head' },
            h('span', { class: 'jp-wb-eval-run-id', title: r.run }, r.run),
            h('span', { class: `jp-wb-chip jp-wb-eval-state-${r.state}` }, stateWord(r))
          ),
          h('progress', {
            class: 'jp-wb-eval-progress',
            max: Math.max(r.total, 1),
            value: r.finished,
            'aria-label': `Run ${r.run}: ${words}`
          }),
          h('div', { class: 'jp-wb-eval-counts' }, words),
          h(
            'div',
            { class: 'jp-wb-eval-run-foot' },
            h(
              'span',
              { class: 'jp-wb-eval-models', title: r.models.join(', ') },
              `${r.tasks} task${r.tasks === 1 ? '' : 's'} · ${r.models.join(', ')} · ${ago(r.started_at)}`
            ),
            h(
              'button',
              {
                class: 'jp-wb-button jp-wb-eval-open',
                'data-run': r.run,
                'aria-label': `Open the report of run ${r.run}`,
                title: 'Open the report in the main area',
                onclick: () => this.open(r.run)
              },
              'Report'
            )
          )
        );
      })
    );
    if (!runs.length) {
      this.list.append(
        h(
          'li',
          { class: 'jp-wb-empty' },
          'No eval runs yet. Start one with wb.eval(...) in a notebook or workbench eval.'
        )
      );
    }
    if (focused) {
      this.list.querySelector<HTMLElement>(`button[data-run="${CSS.escape(focused)}"]`)?.focus();
    }
  }
}
