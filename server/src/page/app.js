// The page's wiring: the conversation list, the settings form, the composer and its keys,
// the server's figures, and the API key dialog.

import * as api from "./api.js";
import * as chat from "./chat.js";
import * as storage from "./storage.js";

const $ = (id) => document.getElementById(id);

let conversations = storage.load();
let current = null;
let running = null; // the AbortController of the answer streaming in

const persist = () => storage.save(conversations);

function select(conversation) {
  current = conversation;
  localStorage.setItem("conductor.current", conversation.id);
  $("title").textContent = conversation.title;
  fillSettings(conversation.settings);
  chat.show(conversation);
  drawList();
  $("sidebar").classList.remove("open");
}

function drawList() {
  $("conversations").replaceChildren(
    ...conversations.map((c) => {
      const li = document.createElement("li");
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = c.title;
      b.dataset.id = c.id;
      b.setAttribute("aria-current", String(c === current));
      b.addEventListener("click", () => running || select(c));
      li.append(b);
      return li;
    }),
  );
}

function newChat() {
  const c = storage.create();
  conversations.unshift(c);
  persist();
  select(c);
  $("input").focus();
}

const NUMBERS = ["temperature", "top_p", "max_tokens", "seed"];

function fillSettings(s) {
  $("system").value = s.system;
  for (const name of NUMBERS) $(name).value = s[name] ?? "";
}

/** Reads the settings form into the current conversation (an empty seed: random). */
function readSettings() {
  const s = current.settings;
  s.system = $("system").value;
  for (const name of NUMBERS) {
    const raw = $(name).value.trim();
    const n = Number(raw);
    if (raw === "" || !Number.isFinite(n)) s[name] = name === "seed" ? null : storage.DEFAULT_SETTINGS[name];
    else s[name] = n;
  }
  persist();
}

async function sendInput() {
  const text = $("input").value;
  if (!text.trim() || running) return;
  $("input").value = "";
  running = new AbortController();
  $("send").hidden = true;
  $("stop").hidden = false;
  try {
    await chat.send(current, text, running.signal, () => {
      $("title").textContent = current.title;
      persist();
      drawList();
    });
  } catch (e) {
    if (e.status === 401) askKey();
  } finally {
    running = null;
    $("send").hidden = false;
    $("stop").hidden = true;
    $("input").focus();
  }
}

function stop() {
  if (running) running.abort();
}

function askKey() {
  $("key-input").value = "";
  if (!$("key-dialog").open) $("key-dialog").showModal();
}

async function showServer() {
  const info = $("server-info");
  try {
    const p = await api.props();
    const lines = [`model ${p.model}`, `context ${p.n_ctx} tokens`, `${p.slots} slot(s), queue ${p.queue}`];
    if (p.memory) {
      lines.push(`memory budget ${chat.formatBytes(p.memory.budget)}`);
      lines.push(`neuron cache ${chat.formatBytes(p.memory.neuron_cache)}`);
    } else {
      lines.push("no memory budget (whole model in memory)");
    }
    info.replaceChildren(...lines.map((l) => Object.assign(document.createElement("div"), { textContent: l })));
  } catch (e) {
    info.textContent = e.message;
    if (e.status === 401) askKey();
  }
}

function wire() {
  $("new-chat").addEventListener("click", () => running || newChat());
  $("rename").addEventListener("click", () => {
    const title = prompt("Rename this conversation", current.title);
    if (title && title.trim()) {
      current.title = title.trim();
      $("title").textContent = current.title;
      persist();
      drawList();
    }
  });
  $("delete").addEventListener("click", () => {
    if (running || !confirm(`Delete “${current.title}”?`)) return;
    conversations = conversations.filter((c) => c !== current);
    persist();
    if (conversations.length) select(conversations[0]);
    else newChat();
  });
  $("toggle-settings").addEventListener("click", () => {
    const form = $("settings");
    form.hidden = !form.hidden;
    $("toggle-settings").setAttribute("aria-expanded", String(!form.hidden));
  });
  $("toggle-sidebar").addEventListener("click", () => $("sidebar").classList.toggle("open"));
  $("settings").addEventListener("input", readSettings);
  $("settings").addEventListener("submit", (e) => e.preventDefault());
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    sendInput();
  });
  $("stop").addEventListener("click", stop);
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      sendInput();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && running) {
      e.preventDefault();
      stop();
    }
  });
  $("key-form").addEventListener("submit", () => {
    api.setApiKey($("key-input").value.trim());
    showServer();
  });
}

wire();
const last = localStorage.getItem("conductor.current");
const start = conversations.find((c) => c.id === last) ?? conversations[0];
if (start) select(start);
else newChat();
showServer();
