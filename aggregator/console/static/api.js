// The console's JSON API: every call sends the bearer token (kept for this tab only) and the "view as" scopes.
const TOKEN_KEY = "aggregator-console-token";
let viewAs = null;

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export function setViewAs(value) {
  viewAs = value || null;
}

function address(path, params) {
  const url = new URL("/console/api/" + path, location.origin);
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
  }
  if (viewAs !== null) url.searchParams.set("as", viewAs);
  return url;
}

function headers() {
  const t = token();
  return t ? { Authorization: "Bearer " + t } : {};
}

async function fetched(path, params, signal) {
  const response = await fetch(address(path, params), { headers: headers(), cache: "no-store", signal });
  if (!response.ok) {
    let message = response.statusText || "request failed";
    try {
      message = (await response.json()).error || message;
    } catch (_) { /* not JSON: keep the status text */ }
    throw new ApiError(response.status, message);
  }
  return response;
}

export async function get(path, params) {
  return (await fetched(path, params)).json();
}

export async function blob(path, params) {
  return (await fetched(path, params)).blob();
}

// Server-sent events over fetch (EventSource cannot send the Authorization header): yields {event, data}.
export async function* events(signal) {
  const response = await fetched("events", {}, signal);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  while (true) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      let data = "";
      for (const line of frame.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) yield { event, data: JSON.parse(data) };
    }
  }
}
