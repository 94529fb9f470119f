// One conversation on screen: its messages, and sending the next one with its answer
// streaming in, stoppable.

import { ApiError, streamChat } from "./api.js";
import { render } from "./markdown.js";

const messagesBox = () => document.getElementById("messages");

/** The line under an answer: the server's own figures for it. */
export function describe(meta) {
  if (!meta) return "";
  const bits = [];
  const t = meta.timings;
  if (t) {
    bits.push(`${t.generated_tokens} tokens`);
    bits.push(`${t.tokens_per_second.toFixed(1)} tokens/s`);
    bits.push(`first token ${Math.round(t.time_to_first_token_ms)} ms`);
    const cache = t.neuron_cache;
    if (cache) {
      bits.push(`cache hit rate ${(cache.hit_rate * 100).toFixed(1)}%`);
      bits.push(`${formatBytes(cache.bytes_read_per_token)} read/token`);
    }
  }
  if (meta.stopped) bits.push("stopped");
  else if (meta.finishReason === "length") bits.push("cut at max tokens");
  return bits.join(" · ");
}

export function formatBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** The element of one message; `update(message)` redraws it as it grows. */
function messageElement(message) {
  const el = document.createElement("div");
  el.className = `message ${message.role}`;
  const body = document.createElement("div");
  body.className = "body";
  const meta = document.createElement("div");
  meta.className = "meta";
  el.append(body, meta);
  const update = (m) => {
    if (m.role === "assistant") render(body, m.content);
    else body.textContent = m.content;
    meta.textContent = describe(m.meta);
  };
  update(message);
  return { el, update };
}

function scrollDown() {
  const box = messagesBox();
  box.scrollTop = box.scrollHeight;
}

export function show(conversation) {
  messagesBox().replaceChildren(...conversation.messages.map((m) => messageElement(m).el));
  scrollDown();
}

/** What the API is sent for `conversation`: its system prompt, its turns and its settings. */
export function request(conversation) {
  const s = conversation.settings;
  const messages = [];
  if (s.system.trim()) messages.push({ role: "system", content: s.system });
  for (const m of conversation.messages) {
    if (m.role === "user" || m.role === "assistant") messages.push({ role: m.role, content: m.content });
  }
  const body = { messages, temperature: s.temperature, top_p: s.top_p, max_tokens: s.max_tokens };
  if (s.seed !== null && s.seed !== undefined) body.seed = s.seed;
  return body;
}

/**
 * Adds `text` to `conversation` as the user's turn and streams the answer in. `signal`
 * stops it; `changed()` is called whenever the conversation should be saved.
 */
export async function send(conversation, text, signal, changed) {
  const user = { role: "user", content: text };
  conversation.messages.push(user);
  if (conversation.title === "New chat") conversation.title = text.slice(0, 40);
  messagesBox().append(messageElement(user).el);
  const body = request(conversation);
  const answer = { role: "assistant", content: "", meta: null };
  const view = messageElement(answer);
  messagesBox().append(view.el);
  scrollDown();
  changed();
  try {
    const end = await streamChat(body, signal, (piece) => {
      answer.content += piece;
      view.update(answer);
      scrollDown();
    });
    answer.meta = { finishReason: end.finishReason, timings: end.timings };
  } catch (e) {
    if (e.name === "AbortError") {
      answer.meta = { stopped: true };
    } else {
      const error = { role: "error", content: e instanceof ApiError ? e.message : String(e) };
      if (!answer.content) view.el.remove();
      else conversation.messages.push(answer);
      conversation.messages.push(error);
      messagesBox().append(messageElement(error).el);
      scrollDown();
      changed();
      if (e instanceof ApiError && e.status === 401) throw e;
      return;
    }
  }
  conversation.messages.push(answer);
  view.update(answer);
  changed();
}
