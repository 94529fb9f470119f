// Conversations in the browser's localStorage: one JSON list, written after each change.

const ITEM = "conductor.conversations";

/** The settings a new conversation starts with. */
export const DEFAULT_SETTINGS = {
  system: "",
  temperature: 0.7,
  top_p: 0.95,
  max_tokens: 512,
  seed: null,
};

export function load() {
  try {
    const list = JSON.parse(localStorage.getItem(ITEM) ?? "[]");
    return Array.isArray(list) ? list.filter((c) => c && Array.isArray(c.messages)) : [];
  } catch {
    // A damaged entry is dropped rather than leaving a blank page.
    return [];
  }
}

export function save(conversations) {
  try {
    localStorage.setItem(ITEM, JSON.stringify(conversations));
  } catch {
    // Storage full or off (private browsing): the conversation lives on in the tab.
  }
}

export function create() {
  return {
    id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`,
    title: "New chat",
    settings: { ...DEFAULT_SETTINGS },
    // { role: "user" | "assistant" | "error", content, meta? }
    messages: [],
  };
}
