// The chat's conversations, kept in this browser (localStorage, per node address): a list to switch between and
// delete, each with its model and turns. Nothing is written until a first message is sent.
const LIST_KEY = "exo.chat.conversations";
const CURRENT_KEY = "exo.chat.current";

// A turn: {role, content, tool_calls?, tool_call_id?} as the API takes it, plus what the page shows about it
// (`stats` of a reply, `error`, `failed` for a message that got no answer and is not sent again).
export function newConversation(model) {
  return { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "New chat", model,
    turns: [], updated: Date.now() };
}

export function loadConversations() {
  try {
    const listed = JSON.parse(localStorage.getItem(LIST_KEY) ?? "[]");
    return Array.isArray(listed) ? listed.filter((conversation) => conversation?.id && Array.isArray(conversation.turns))
      : [];
  } catch {
    return [];  // unreadable (edited by hand, another version): start afresh rather than break the page
  }
}

export function currentConversationId() {
  return localStorage.getItem(CURRENT_KEY);
}

// Saves the list (newest first) and which one is open; false when the browser refused (storage full).
export function saveConversations(conversations, currentId) {
  const kept = conversations.filter((conversation) => conversation.turns.length > 0);
  try {
    localStorage.setItem(LIST_KEY, JSON.stringify(kept));
    if (currentId && kept.some((conversation) => conversation.id === currentId)) {
      localStorage.setItem(CURRENT_KEY, currentId);
    } else {
      localStorage.removeItem(CURRENT_KEY);
    }
    return true;
  } catch {
    return false;
  }
}

// The title a conversation is listed under: the start of its first message.
export function titleOf(text) {
  const line = text.trim().split("\n")[0];
  return line.length > 48 ? `${line.slice(0, 47)}…` : line || "New chat";
}
