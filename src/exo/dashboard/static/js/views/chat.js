// Chat playground: a streamed chat completion with tools. Tool calls are drawn as their deltas arrive (the name,
// then the arguments filling in), the raw server-sent events are kept for the curious, and the results of the
// calls can be typed in to continue the turn.
import { request, serverSentEvents } from "../api.js";
import { fill, h, section } from "../dom.js";

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
  const tools = h("textarea", { id: "chat-tools", name: "tools", rows: 8, spellcheck: false, class: "code" });
  tools.value = JSON.stringify(EXAMPLE_TOOLS, null, 2);
  const toolChoice = h("select", { id: "chat-tool-choice", name: "tool_choice" },
    ["auto", "none", "required", "named"].map((value) => h("option", { value }, value)));
  const namedTool = h("input", { id: "chat-named-tool", name: "named_tool", autocomplete: "off",
    placeholder: "function name" });
  const namedField = h("div", { class: "field", hidden: true },
    h("label", { for: "chat-named-tool" }, "Function to call"), namedTool);
  toolChoice.addEventListener("change", () => { namedField.hidden = toolChoice.value !== "named"; });
  const maxTokens = h("input", { id: "chat-max-tokens", name: "max_tokens", type: "number", min: 1, value: "256",
    inputmode: "numeric" });
  const system = h("textarea", { id: "chat-system", name: "system", rows: 2 });
  const message = h("textarea", { id: "chat-message", name: "message", rows: 3,
    placeholder: "Ask something (Ctrl+Enter sends)" });
  const send = h("button", { type: "submit" }, "Send");
  const stop = h("button", { type: "button", disabled: true }, "Stop");
  const clear = h("button", { type: "button" }, "New conversation");
  const problem = h("p", { class: "error", role: "alert" });
  const transcript = h("ol", { class: "transcript", "aria-label": "Conversation", "aria-live": "polite" });
  const toolResults = h("form", { class: "tool-results", hidden: true, "aria-label": "Tool results" });
  const raw = h("pre", { class: "raw code", tabindex: 0, "aria-label": "Raw server-sent events" });
  const form = h("form", { class: "chat-form", "aria-label": "Chat request" },
    h("div", { class: "field" }, h("label", { for: "chat-model" }, "Model"), model),
    h("div", { class: "field" }, h("label", { for: "chat-tool-choice" }, "tool_choice"), toolChoice),
    namedField,
    h("div", { class: "field" }, h("label", { for: "chat-max-tokens" }, "max_tokens"), maxTokens),
    h("div", { class: "field wide" }, h("label", { for: "chat-tools" }, "Tools (JSON list)"), tools),
    h("div", { class: "field wide" }, h("label", { for: "chat-system" }, "System prompt (optional)"), system),
    h("div", { class: "field wide" }, h("label", { for: "chat-message" }, "Message"), message),
    h("div", { class: "actions wide" }, send, stop, clear), problem);
  const element = section("chat", "Chat", form, transcript, toolResults,
    h("details", {}, h("summary", {}, "Raw SSE of the last reply"), raw));

  let messages = [];
  let controller = null;

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = message.value.trim();
    if (!text) {
      problem.textContent = "Write a message first.";
      return;
    }
    message.value = "";
    messages.push({ role: "user", content: text });
    transcript.append(bubble("user", text));
    complete();
  });
  message.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  stop.addEventListener("click", () => controller?.abort());
  clear.addEventListener("click", () => {
    controller?.abort();
    messages = [];
    fill(transcript);
    toolResults.hidden = true;
    fill(raw);
    problem.textContent = "";
  });

  function requestBody() {
    const body = { model: model.value, messages: [...messages], stream: true, stream_options: { include_usage: true } };
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

  async function complete() {
    problem.textContent = "";
    toolResults.hidden = true;
    let body;
    try {
      body = requestBody();
    } catch (error) {
      problem.textContent = `Tools: ${error.message}`;
      return;
    }
    controller = new AbortController();
    send.disabled = true;
    stop.disabled = false;
    fill(raw);
    const reply = assistantBubble();
    transcript.append(reply.element);
    try {
      const response = await request("/v1/chat/completions", { method: "POST", body, signal: controller.signal });
      if (!response.ok) {
        const text = await response.text();
        let shown = text;
        try { shown = JSON.parse(text).error.message; } catch { /* not JSON: shown as it came */ }
        throw new Error(`${response.status}: ${shown}`);
      }
      for await (const event of serverSentEvents(response)) {
        raw.append(`${event.raw}\n\n`);
        if (event.data === "[DONE]") break;
        reply.take(JSON.parse(event.data));
      }
    } catch (error) {
      if (error.name !== "AbortError") reply.fail(error.message);
      else reply.fail("stopped");
    } finally {
      controller = null;
      send.disabled = false;
      stop.disabled = true;
    }
    const answer = reply.message();
    messages.push(answer);
    if (answer.tool_calls?.length) askForResults(answer.tool_calls);
  }

  function askForResults(calls) {
    fill(toolResults,
      h("h3", {}, "Tool results"),
      calls.map((call, index) => h("div", { class: "field wide" },
        h("label", { for: `tool-result-${index}` }, `Result of ${call.function.name} (${call.id})`),
        h("textarea", { id: `tool-result-${index}`, rows: 2, "data-call-id": call.id, class: "code" }))),
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Send tool results")));
    toolResults.hidden = false;
    toolResults.querySelector("textarea").focus();
  }
  toolResults.addEventListener("submit", (event) => {
    event.preventDefault();
    for (const area of toolResults.querySelectorAll("textarea")) {
      messages.push({ role: "tool", tool_call_id: area.dataset.callId, content: area.value });
      transcript.append(bubble("tool", area.value));
    }
    complete();
  });

  return {
    element,
    update(snapshot) {
      const ids = snapshot.summary.models.map((served) => served.model_id);
      const shown = [...model.options].map((option) => option.value);
      if (ids.join("\n") === shown.join("\n")) return;
      const chosen = model.value;
      fill(model, ids.map((id) => h("option", { value: id, selected: id === chosen }, id)));
    },
  };
}

function bubble(role, text) {
  return h("li", { class: `message message-${role}` }, h("span", { class: "role" }, role), h("div", { class: "text" }, text));
}

// The assistant's reply as it streams: text, reasoning, and one card per tool call.
function assistantBubble() {
  const reasoning = h("div", { class: "reasoning muted" });
  const text = h("div", { class: "text" });
  const calls = h("ol", { class: "tool-calls", "aria-label": "Tool calls" });
  const footer = h("p", { class: "muted footer" });
  const element = h("li", { class: "message message-assistant" }, h("span", { class: "role" }, "assistant"),
    reasoning, text, calls, footer);
  const toolCalls = [];
  let content = "";
  let finish = null;
  let usage = null;

  function take(chunk) {
    if (chunk.error) {
      fail(chunk.error.message ?? JSON.stringify(chunk.error));
      return;
    }
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices ?? []) {
      const delta = choice.delta ?? {};
      if (delta.reasoning_content) reasoning.append(delta.reasoning_content);
      if (delta.content) {
        content += delta.content;
        text.append(delta.content);
      }
      for (const part of delta.tool_calls ?? []) takeToolCall(part);
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    const cached = usage?.prompt_tokens_details?.cached_tokens;
    fill(footer, [finish ? `finish: ${finish}` : "streaming…",
      usage ? ` · ${usage.prompt_tokens} prompt tokens${cached ? ` (${cached} cached)` : ""}, `
        + `${usage.completion_tokens} generated` : ""]);
  }

  function takeToolCall(part) {
    let call = toolCalls[part.index];
    if (!call) {
      const name = h("strong", { class: "tool-name" });
      const id = h("span", { class: "muted" });
      const argumentsView = h("pre", { class: "tool-arguments code" });
      calls.append(h("li", { class: "tool-call" }, "call ", name, " ", id, argumentsView));
      call = { id: "", name: "", arguments: "", view: { name, id, argumentsView } };
      toolCalls[part.index] = call;
    }
    if (part.id) call.id = part.id;
    if (part.function?.name) call.name += part.function.name;
    if (part.function?.arguments) call.arguments += part.function.arguments;
    call.view.name.textContent = call.name;
    call.view.id.textContent = call.id;
    call.view.argumentsView.textContent = call.arguments;
  }

  function fail(reason) {
    element.append(h("p", { class: "error", role: "alert" }, `Error: ${reason}`));
  }

  function message() {
    const answer = { role: "assistant", content: content || null };
    const made = toolCalls.filter(Boolean);
    if (made.length) {
      answer.tool_calls = made.map((call) => ({ id: call.id, type: "function",
        function: { name: call.name, arguments: call.arguments } }));
    }
    return answer;
  }

  return { element, take, fail, message };
}
