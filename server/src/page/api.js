// Calls to the server's API: the API key (asked once, kept in this tab's sessionStorage),
// OpenAI-style errors turned into sentences, and the SSE stream of a chat completion.

const KEY_ITEM = "conductor.apiKey";

/** An error the page shows as a message. `status` is the HTTP status (0: no answer). */
export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY_ITEM);
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_ITEM, key);
  else sessionStorage.removeItem(KEY_ITEM);
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

/** The sentence for an answer that is not 200 (its body is OpenAI's error object). */
async function failure(response) {
  let message = "";
  try {
    message = (await response.json()).error?.message ?? "";
  } catch {
    // Not JSON: the status says it.
  }
  switch (response.status) {
    case 401:
      return new ApiError("The API key is missing or wrong.", 401);
    case 429: {
      const after = response.headers.get("Retry-After");
      const wait = after ? ` Try again in ${after} s.` : "";
      return new ApiError(`The server is busy: its queue is full.${wait}`, 429);
    }
    default:
      return new ApiError(message || `The server answered ${response.status}.`, response.status);
  }
}

async function call(path, init = {}) {
  let response;
  try {
    response = await fetch(path, { ...init, headers: headers() });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError("The server cannot be reached (is `conductor serve` still running?).", 0);
  }
  if (!response.ok) throw await failure(response);
  return response;
}

/** `/props`: model, context, slots and memory budget. */
export async function props() {
  return (await call("/props")).json();
}

/**
 * Streams a chat completion of `body` (OpenAI's request), calling `onText(piece)` for each
 * piece of the answer; resolves to `{finishReason, timings}`. `signal` aborts it (the server
 * sees the connection close and frees the slot).
 */
export async function streamChat(body, signal, onText) {
  const response = await call("/v1/chat/completions", {
    method: "POST",
    body: JSON.stringify({ ...body, stream: true }),
    signal,
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let end = { finishReason: null, timings: null };
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError("The connection to the server was lost mid-answer.", 0);
    }
    if (chunk.done) break;
    buffer += chunk.value;
    // SSE events end with a blank line; each of ours is one `data:` line.
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return end;
        const message = JSON.parse(data);
        if (message.error) throw new ApiError(message.error.message, 500);
        const choice = message.choices?.[0];
        if (choice?.delta?.content) onText(choice.delta.content);
        if (choice?.finish_reason) end = { finishReason: choice.finish_reason, timings: message.timings ?? null };
      }
    }
  }
  if (end.finishReason) return end;
  throw new ApiError("The answer ended before the server finished it.", 0);
}
