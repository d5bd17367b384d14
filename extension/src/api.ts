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
  [key: string]: any;
}

/** A message from the session stream: a committed event or a live model delta. */
export type StreamMessage =
  { kind: 'event'; event: IEvent } | { kind: 'delta'; session_id: string; event: any };

/** An HTTP error from the API, carrying the server's one-line message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
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

  async sessions(): Promise<ISession[]> {
    return (await this.request<{ sessions: ISession[] }>('sessions')).sessions;
  }

  createSession(body: { title?: string; model?: string } = {}): Promise<ISession> {
    return this.post('sessions', body);
  }

  send(id: string, text: string): Promise<{ session_id: string; seq: number }> {
    return this.post(`sessions/${id}/messages`, { text });
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

  /** Open the session's event stream; `after` is the last seq already shown. */
  stream(id: string, after: number, onMessage: (m: StreamMessage) => void): WebSocket {
    let url = URLExt.join(this.settings.wsUrl, 'workbench/api', `sessions/${id}/stream`);
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
