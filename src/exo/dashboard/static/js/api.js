// Every call the page makes goes through here: the API key (kept in sessionStorage, so for this tab only) is sent
// as a bearer token, and a 401 asks for the key once for all the calls waiting on it, then retries them.
const KEY_NAME = "exo.apiKey";
let askForKey = null;
let pendingKey = null;

export function onKeyNeeded(ask) {
  askForKey = ask;
}

export function currentKey() {
  return sessionStorage.getItem(KEY_NAME);
}

export function setKey(key) {
  sessionStorage.setItem(KEY_NAME, key);
}

function keyFromUser(wasRefused) {
  pendingKey ??= askForKey(wasRefused).then((key) => {
    setKey(key);
    pendingKey = null;
    return key;
  });
  return pendingKey;
}

export async function request(path, { method = "GET", body, signal } = {}) {
  for (;;) {
    const key = currentKey();
    const headers = body === undefined ? {} : { "content-type": "application/json" };
    if (key) headers.authorization = `Bearer ${key}`;
    const response = await fetch(path, {
      method, signal, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status !== 401 || askForKey === null) return response;
    // Refused with a key the user has since replaced (a wrong key's check is slow: PBKDF2): the new key is tried
    // before the user is asked again.
    if (currentKey() !== key) continue;
    await keyFromUser(key !== null);
  }
}

// The JSON of a successful answer; otherwise throws with the API's error message in words.
export async function getJson(path, options) {
  const response = await request(path, options);
  const text = await response.text();
  let parsed = null;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = null;
  }
  if (!response.ok) throw new ApiError(response.status, parsed?.error?.message ?? (text || response.statusText));
  return parsed;
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// Streamed answers are read by sse.js (comments and keep-alives skipped, events split on blank lines).
export { serverSentEvents } from "./sse.js";
