// The workbench REST and websocket API (docs/api.md), and nothing else.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export interface ISession {
  id: string;
  title: string;
  model: string;
  kind: string;
  created_at: string;
  updated_at: string;
  events: number;
  last_seq: number;
  last_type: string | null;
  running: boolean;
  /** The session that delegated to this one (null for a session a person started). */
  parent_id?: string | null;
}

export interface ISessionsQuery {
  kind?: string;
  state?: string;
  q?: string;
  updated_after?: string;
  updated_before?: string;
  order?: 'created' | '-created' | 'updated' | '-updated';
  limit?: number;
  cursor?: string | null;
}

export interface ISessionsPage {
  sessions: ISession[];
  next: string | null;
}

export interface IEvent {
  session_id: string;
  seq: number;
  ts: string;
  type: string;
  payload: any;
}

export interface IHands {
  backend?: string;
  state?: string;
  generation?: number;
  pid?: number | null;
  [key: string]: any;
}

export interface IMemory {
  id: string;
  title?: string;
  text?: string;
  status?: string;
  proposal?: string;
  tags?: string[];
  provenance?: { session_id: string; seq: number }[];
  updated_at?: string;
  /** Live memories this one looks contradictory to, and why (docs/memory.md, "Contradictions"). */
  conflicts?: IConflict[];
  [key: string]: any;
}

export interface IConflict {
  id: string;
  title: string;
  text: string;
  status: string;
  updated_at: string;
  why: string;
}

/** The live output of a running tool call (not stored; docs/api.md, "Live output"). */
export interface IOutput {
  kind: 'output';
  session_id: string;
  tool_use_id: string;
  name: string;
  n: number;
  text: string;
  skipped: number;
  elapsed_s: number;
  started_at: number;
  state: 'running' | 'done';
  hands: string;
  snapshot: boolean;
  over_limit: boolean;
}

/** One output of an attached cell, as text (docs/api.md, "Notebook context"). */
export interface IAttachedOutput {
  type: 'stream' | 'result' | 'error' | 'note';
  text?: string;
  ename?: string;
  evalue?: string;
  traceback?: string[];
}

/** One attached cell: its place in the notebook, its source and its outputs as text. */
export interface IAttachedCell {
  index: number;
  id?: string;
  cell_type: 'code' | 'markdown' | 'raw';
  source: string;
  outputs: IAttachedOutput[];
}

/** Cells of a notebook (or the notebook) sent with a message; `omitted`: cells left out for the budget. */
export interface IAttachment {
  kind: 'cells' | 'notebook';
  path: string;
  cells: IAttachedCell[];
  omitted?: number;
}

/** One eval run of the listing (GET /evals; docs/api.md, "Evals"). */
export interface IEvalRun {
  run: string;
  /** running, done, interrupted, failed (this server runs it), or stopped (it does not). */
  state: string;
  started_at: string;
  models: string[];
  tasks: number;
  total: number;
  attempts: number;
  finished: number;
  passed: number;
  failed: number;
  errors: number;
  retried: number;
}

/** One attempt of a run: a row of the eval_results view (docs/evals.md, "Results"). */
export interface IEvalAttempt {
  run: string;
  task: string;
  model: string;
  epoch: number;
  /** pass, fail or error; null while unfinished. */
  outcome: string | null;
  passed: boolean | null;
  score: number | null;
  turns: number;
  tool_calls: number;
  input_tokens: number;
  output_tokens: number;
  cost: number | null;
  wall_s: number | null;
  session_id: string;
  reason: string | null;
  tries: number | null;
}

/** Per model: the pass rate over graded attempts (errors apart) with its Wilson interval, cost and latency. */
export interface IEvalSummary {
  model: string;
  n: number;
  passed: number;
  failed: number;
  rate: number | null;
  low: number | null;
  high: number | null;
  errors: number;
  unfinished: number;
  retried: number;
  cost: number;
  priced: boolean;
  mean_wall_s: number | null;
  input_tokens: number;
  output_tokens: number;
  tokens: number;
}

/** Model b against model a over their shared graded tasks, or why the pair cannot be compared. */
export interface IEvalComparison {
  a?: string;
  b?: string;
  n?: number;
  estimate?: number | null;
  low?: number | null;
  high?: number | null;
  wins?: number;
  losses?: number;
  p?: number | null;
  confidence?: number;
  verdict?: string;
  error?: string;
}

/** A run's report (GET /evals/{id}/report). */
export interface IEvalReport {
  run: string;
  state: string;
  total: number;
  finished: number;
  error: string | null;
  models: string[];
  tasks: string[];
  summary: IEvalSummary[];
  comparisons: IEvalComparison[];
  results: IEvalAttempt[];
}

/** A message from the session stream: a committed event, a live model delta or a running call's output. */
export type StreamMessage =
  { kind: 'event'; event: IEvent } | { kind: 'delta'; session_id: string; event: any } | IOutput;

/** An HTTP error from the API, carrying the server's one-line message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

/** How often a message that got no answer is sent again, with its key. */
const SEND_RETRIES = 2;

/** A random idempotency key (crypto.randomUUID needs a secure context; a server over plain HTTP is not one). */
function newKey(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, b => b.toString(16).padStart(2, '0')).join('');
}

export class WorkbenchApi {
  constructor(readonly settings = ServerConnection.makeSettings()) {}

  /** Call a route under {base_url}workbench/api/ and return the parsed JSON body. */
  async request<T = any>(path: string, init: RequestInit = {}): Promise<T> {
    const url = URLExt.join(this.settings.baseUrl, 'workbench/api', path);
    const response = await ServerConnection.makeRequest(url, init, this.settings);
    const text = await response.text();
    let body: any = {};
    try {
      body = text ? JSON.parse(text) : {};
    } catch {
      // Not JSON: an HTML error page from Jupyter itself (e.g. a route that does not exist).
      body = { error: `${response.status} ${response.statusText}` };
    }
    if (!response.ok) {
      throw new ApiError(
        response.status,
        body.error || `${response.status} ${response.statusText}`
      );
    }
    return body as T;
  }

  private post<T = any>(path: string, body: unknown = {}, method = 'POST'): Promise<T> {
    return this.request<T>(path, { method, body: JSON.stringify(body) });
  }

  /** The session's code and outputs as a notebook (nbformat 4 JSON: GET /sessions/{id}/notebook). */
  notebook(id: string): Promise<any> {
    return this.request(`sessions/${encodeURIComponent(id)}/notebook`);
  }

  async sessions(): Promise<ISession[]> {
    return (await this.request<{ sessions: ISession[] }>('sessions')).sessions;
  }

  /** A page of sessions (GET /sessions with its filters): the rows and the cursor of the page after, if any. */
  sessionsPage(query: ISessionsQuery): Promise<ISessionsPage> {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(query)) {
      if (value !== undefined && value !== null && value !== '') {
        params.set(key, String(value));
      }
    }
    return this.request<ISessionsPage>(`sessions?${params.toString()}`);
  }

  /** `first_message`: the message about to be sent (not sent): what the session's memories are ranked by. */
  createSession(
    body: { title?: string; model?: string; first_message?: string } = {}
  ): Promise<ISession> {
    return this.post('sessions', body);
  }

  /**
   * Send a message with an idempotency key of its own, and send it again with the same key when the
   * connection fails: the server records it once (docs/api.md, "Retrying safely").
   */
  async send(
    id: string,
    text: string,
    attachments: IAttachment[] = []
  ): Promise<{ session_id: string; seq: number }> {
    const body = {
      text,
      idempotency_key: newKey(),
      ...(attachments.length ? { attachments } : {})
    };
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.post(`sessions/${id}/messages`, body);
      } catch (e) {
        if (!(e instanceof ServerConnection.NetworkError) || attempt >= SEND_RETRIES) {
          throw e;
        }
      }
    }
  }

  interrupt(id: string): Promise<{ interrupted: boolean }> {
    return this.post(`sessions/${id}/interrupt`);
  }

  hands(id: string): Promise<IHands> {
    return this.request(`sessions/${id}/hands`);
  }

  restartHands(id: string): Promise<IHands> {
    return this.post(`sessions/${id}/hands/restart`);
  }

  async memories(status = 'proposed'): Promise<IMemory[]> {
    const body = await this.request<{ memories: IMemory[] }>(
      `memories?status=${encodeURIComponent(status)}`
    );
    return body.memories || [];
  }

  review(id: string, action: 'accept' | 'reject'): Promise<IMemory> {
    return this.post(`memories/${id}`, { action }, 'PATCH');
  }

  /** Every eval run in the log, oldest first, with its progress (GET /evals). */
  async evalRuns(): Promise<IEvalRun[]> {
    return (await this.request<{ runs: IEvalRun[] }>('evals')).runs || [];
  }

  /** What a run's report shows (GET /evals/{id}/report). */
  evalReport(run: string): Promise<IEvalReport> {
    return this.request(`evals/${encodeURIComponent(run)}/report`);
  }

  /** Open the session's event stream; `after` is the last seq already shown. */
  stream(id: string, after: number, onMessage: (m: StreamMessage) => void): WebSocket {
    let url = URLExt.join(
      this.settings.wsUrl,
      'workbench/api',
      `sessions/${encodeURIComponent(id)}/stream`
    );
    url += `?after=${after}`;
    // Browsers cannot set headers on a websocket; Jupyter accepts the token as a parameter.
    if (this.settings.token) {
      url += `&token=${encodeURIComponent(this.settings.token)}`;
    }
    const ws = new WebSocket(url);
    ws.onmessage = msg => onMessage(JSON.parse(msg.data));
    return ws;
  }
}
