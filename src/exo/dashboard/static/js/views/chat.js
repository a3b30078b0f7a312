// Chat: conversations kept in this browser, a streamed chat completion per turn (markdown and code blocks, the
// node's prefill progress while the first token is awaited, time to first token and tokens/s per reply), and tools
// folded away until wanted: their tool_choice, the calls drawn as their deltas arrive, and the results typed in to
// continue the turn. Stop, or leaving the page, aborts the request, so the node cancels it.
import { request } from "../api.js";
import { currentConversationId, loadConversations, newConversation, saveConversations, titleOf }
  from "../conversations.js";
import { fill, h, section } from "../dom.js";
import { serverSentEvents } from "../sse.js";
import { storedReply, streamingReply } from "./chat_reply.js";
import { followEnd } from "./follow_end.js";

const EXAMPLE_TOOLS = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];

export function createChatView() {
  const model = h("select", { id: "chat-model", name: "model" });
  const message = h("textarea", { id: "chat-message", name: "message", rows: 3,
    placeholder: "Ask something (Enter sends, Shift+Enter starts a new line)" });
  const send = h("button", { type: "submit" }, "Send");
  const stop = h("button", { type: "button", disabled: true }, "Stop");
  const problem = h("p", { class: "error", role: "alert" });
  const tools = h("textarea", { id: "chat-tools", name: "tools", rows: 8, spellcheck: false, class: "code",
    placeholder: "[] (no tools)" });
  const exampleTools = h("button", { type: "button", class: "secondary" }, "Insert an example tool");
  const toolChoice = h("select", { id: "chat-tool-choice", name: "tool_choice" },
    ["auto", "none", "required", "named"].map((value) => h("option", { value }, value)));
  const namedTool = h("input", { id: "chat-named-tool", name: "named_tool", autocomplete: "off",
    placeholder: "function name" });
  const namedField = h("div", { class: "field", hidden: true },
    h("label", { for: "chat-named-tool" }, "Function to call"), namedTool);
  const maxTokens = h("input", { id: "chat-max-tokens", name: "max_tokens", type: "number", min: 1, value: "1024",
    inputmode: "numeric" });
  const system = h("textarea", { id: "chat-system", name: "system", rows: 2 });
  const settings = h("details", { class: "chat-settings" }, h("summary", {}, "Settings and tools"),
    h("div", { class: "settings-grid" },
      h("div", { class: "field" }, h("label", { for: "chat-max-tokens" }, "max_tokens"), maxTokens),
      h("div", { class: "field" }, h("label", { for: "chat-tool-choice" }, "tool_choice"), toolChoice),
      namedField,
      h("div", { class: "field wide" }, h("label", { for: "chat-system" }, "System prompt (optional)"), system),
      h("div", { class: "field wide" }, h("label", { for: "chat-tools" }, "Tools (JSON list)"), tools),
      h("div", { class: "actions wide" }, exampleTools)));
  const form = h("form", { class: "composer", "aria-label": "Chat request" },
    h("label", { for: "chat-message", class: "visually-hidden" }, "Message"), message,
    h("div", { class: "composer-bar" },
      h("label", { for: "chat-model" }, "Model"), model, h("span", { class: "grow" }), stop, send),
    problem, settings);
  const transcript = h("ol", { class: "transcript", "aria-label": "Conversation", "aria-live": "polite",
    tabindex: 0 });
  const toolResults = h("form", { class: "tool-results", hidden: true, "aria-label": "Tool results" });
  const raw = h("pre", { class: "raw code", tabindex: 0, "aria-label": "Raw server-sent events" });
  const newChat = h("button", { type: "button" }, "New chat");
  const conversationList = h("ul", { class: "conversation-list" });
  const sidebar = h("nav", { class: "chat-sidebar", "aria-label": "Conversations" }, newChat, conversationList);
  const element = section("chat", "Chat", h("div", { class: "chat-layout" }, sidebar,
    h("div", { class: "chat-main" }, transcript, toolResults, form,
      h("details", {}, h("summary", {}, "Raw SSE of the last reply"), raw))));

  let conversations = loadConversations();
  let open = conversations.find((conversation) => conversation.id === currentConversationId())
    ?? newConversation(null);
  let controller = null;
  let streaming = null;  // the conversation a reply streams into
  // The transcript follows a streaming reply to its end, unless the reader scrolled up.
  const follower = followEnd(transcript);
  transcript.addEventListener("reply-changed", () => follower.changed());
  // Leaving the page ends the request here, so the node cancels it rather than generating for no one.
  window.addEventListener("pagehide", () => controller?.abort());
  toolChoice.addEventListener("change", () => { namedField.hidden = toolChoice.value !== "named"; });
  exampleTools.addEventListener("click", () => { tools.value = JSON.stringify(EXAMPLE_TOOLS, null, 2); });
  message.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    form.requestSubmit();
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (controller) return;  // one reply at a time: Stop first
    const text = message.value.trim();
    if (!text) {
      problem.textContent = "Write a message first.";
      return;
    }
    const turn = { role: "user", content: text };
    if (!open.turns.some((kept) => kept.role === "user" && !kept.failed)) open.title = titleOf(text);
    open.turns.push(turn);
    transcript.append(userBubble(turn));
    follower.restart();
    message.value = "";
    complete(turn);
  });
  stop.addEventListener("click", () => controller?.abort());
  newChat.addEventListener("click", () => switchTo(newConversation(model.value || null)));
  toolResults.addEventListener("submit", (event) => {
    event.preventDefault();
    if (controller) return;
    for (const area of toolResults.querySelectorAll("textarea")) {
      const turn = { role: "tool", tool_call_id: area.dataset.callId, name: area.dataset.name, content: area.value };
      open.turns.push(turn);
      transcript.append(toolBubble(turn));
    }
    follower.restart();
    complete(null);
  });

  function switchTo(conversation) {
    controller?.abort();
    open = conversation;
    if (conversation.model && [...model.options].some((option) => option.value === conversation.model)) {
      model.value = conversation.model;
    }
    problem.textContent = "";
    fill(raw);
    drawTranscript();
    drawList();
    persist();
  }

  function drawTranscript() {
    fill(transcript, open.turns.map((turn) => {
      if (turn.role === "user") return userBubble(turn);
      if (turn.role === "tool") return toolBubble(turn);
      return storedReply(turn).element;
    }));
    askForResultsIfDue();
    follower.restart();
  }

  function drawList() {
    const listed = [...conversations].sort((a, b) => b.updated - a.updated);
    fill(conversationList, listed.map((conversation) => h("li", {
      class: conversation.id === open.id ? "conversation open" : "conversation" },
    h("button", { type: "button", class: "conversation-title", "aria-current": conversation.id === open.id
      ? "true" : undefined, onclick: () => switchTo(conversation) }, conversation.title),
    h("button", { type: "button", class: "delete", "aria-label": `Delete conversation ${conversation.title}`,
      onclick: () => remove(conversation) }, "✕"))));
  }

  function remove(conversation) {
    if (streaming === conversation) controller?.abort();
    conversations = conversations.filter((kept) => kept !== conversation);
    if (conversation === open) switchTo(newConversation(model.value || null));
    else {
      drawList();
      persist();
    }
  }

  function persist() {
    if (!saveConversations(conversations, open.id)) {
      problem.textContent = "This browser refused to keep the conversation (its storage is full): delete old ones.";
    }
  }

  function requestBody(conversation) {
    const messages = conversation.turns.filter((turn) => !turn.failed).map((turn) => {
      const sent = { role: turn.role, content: turn.content };
      if (turn.tool_calls) sent.tool_calls = turn.tool_calls;
      if (turn.tool_call_id) sent.tool_call_id = turn.tool_call_id;
      return sent;
    });
    const body = { model: conversation.model, messages, stream: true, stream_options: { include_usage: true } };
    if (system.value.trim()) body.messages.unshift({ role: "system", content: system.value.trim() });
    const listed = tools.value.trim() ? JSON.parse(tools.value) : [];
    if (!Array.isArray(listed)) throw new Error("Tools must be a JSON list of tool definitions.");
    if (listed.length) {
      body.tools = listed;
      body.tool_choice = toolChoice.value === "named"
        ? { type: "function", function: { name: namedTool.value.trim() } } : toolChoice.value;
    }
    if (maxTokens.value) body.max_tokens = Number(maxTokens.value);
    return body;
  }

  // One reply to the open conversation; `asked` is the user's turn that asked for it (null after tool results).
  async function complete(asked) {
    const conversation = open;
    conversation.model = model.value;
    conversation.updated = Date.now();
    if (!conversations.includes(conversation)) conversations.push(conversation);
    problem.textContent = "";
    toolResults.hidden = true;
    let body;
    try {
      body = requestBody(conversation);
    } catch (error) {
      giveBack(conversation, asked, `Tools: ${error.message}`);
      return;
    }
    drawList();
    persist();
    controller = new AbortController();
    streaming = conversation;
    send.disabled = true;
    stop.disabled = false;
    fill(raw);
    const reply = streamingReply(performance.now());
    transcript.append(reply.element);
    try {
      const response = await request("/v1/chat/completions", { method: "POST", body, signal: controller.signal });
      if (!response.ok) throw new Error(await refusal(response));
      const comments = (text) => {
        raw.append(`: ${text}\n\n`);
        reply.comment(text);
      };
      for await (const event of serverSentEvents(response, { onComment: comments })) {
        raw.append(`${event.raw}\n\n`);
        if (event.data === "[DONE]") break;
        reply.take(JSON.parse(event.data));
      }
    } catch (error) {
      reply.fail(error.name === "AbortError" ? "stopped" : error.message);
    } finally {
      controller = null;
      streaming = null;
      send.disabled = false;
      stop.disabled = true;
    }
    const answer = reply.end();
    if (!reply.produced()) {
      reply.element.remove();
      giveBack(conversation, asked, answer.error ?? "the model said nothing");
      return;
    }
    conversation.turns.push(answer);
    conversation.updated = Date.now();
    persist();
    if (conversation === open) askForResultsIfDue();
  }

  // A turn that got no answer stays shown with its error, is not sent again, and its text returns to the box.
  function giveBack(conversation, asked, reason) {
    if (asked) {
      asked.failed = true;
      asked.error = reason;
      if (conversation === open && !message.value.trim()) message.value = asked.content;
    } else {
      conversation.turns.push({ role: "assistant", content: null, failed: true, error: reason });
    }
    persist();
    if (conversation === open) {
      drawTranscript();
      problem.textContent = asked ? `Not sent: ${reason}. Your message is back in the box.` : `Failed: ${reason}`;
    }
  }

  // After a reply that called tools, a box per call for its result; sending them continues the turn.
  function askForResultsIfDue() {
    const last = open.turns.at(-1);
    if (last?.role !== "assistant" || !last.tool_calls?.length) {
      toolResults.hidden = true;
      return;
    }
    fill(toolResults,
      h("h3", {}, "Tool results"),
      last.tool_calls.map((call, index) => h("div", { class: "field wide" },
        h("label", { for: `tool-result-${index}` }, `Result of ${call.function.name} (${call.id})`),
        h("textarea", { id: `tool-result-${index}`, rows: 2, "data-call-id": call.id, "data-name": call.function.name,
          class: "code" }))),
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Send tool results")));
    toolResults.hidden = false;
    toolResults.querySelector("textarea").focus();
  }

  drawTranscript();
  drawList();
  return {
    element,
    update(snapshot) {
      const ids = snapshot.summary.models.map((served) => served.model_id);
      const shown = [...model.options].map((option) => option.value);
      if (ids.join("\n") === shown.join("\n")) return;
      const chosen = model.value || open.model;
      fill(model, ids.map((id) => h("option", { value: id, selected: id === chosen }, id)));
    },
  };
}

async function refusal(response) {
  const text = await response.text();
  try {
    return `${response.status}: ${JSON.parse(text).error.message}`;
  } catch {
    return `${response.status}: ${text || response.statusText}`;
  }
}

function userBubble(turn) {
  return h("li", { class: turn.failed ? "message message-user failed" : "message message-user" },
    h("span", { class: "role" }, "you"), h("div", { class: "text" }, turn.content),
    turn.failed ? h("p", { class: "error" }, `Not answered: ${turn.error}`) : null);
}

function toolBubble(turn) {
  let shown = turn.content;
  try {
    shown = JSON.stringify(JSON.parse(turn.content), null, 2);
  } catch {
    // not JSON: shown as typed
  }
  return h("li", { class: "message message-tool" }, h("span", { class: "role" }, `result of ${turn.name ?? "tool"}`),
    h("pre", { class: "text code" }, shown));
}
