// One assistant reply in the chat: while it streams (waiting with the node's prefill progress, then text, reasoning
// and tool calls as their deltas arrive) and once stored (the same turn drawn again from the browser's history).
// Its footer gives the time to first token and the decode speed measured in this page.
import { fill, h } from "../dom.js";
import { number, seconds } from "../format.js";
import { renderMarkdown } from "../markdown.js";

// Markdown is drawn again at most this often while the text streams (each draw parses the whole reply).
const RENDER_EVERY_MS = 60;
const PREFILL = /^prefill (\d+)\/(\d+) tokens(?: \((\d+) cached\))?/;

export function storedReply(turn) {
  const reply = new Reply();
  Object.assign(reply, { content: turn.content ?? "", reasoning: turn.reasoning ?? "", stats: turn.stats ?? null,
    error: turn.error ?? null, waiting: null });
  reply.calls = (turn.tool_calls ?? []).map((call) => ({ id: call.id, name: call.function.name,
    arguments: call.function.arguments }));
  reply.render();
  return reply;
}

export function streamingReply(sentAt) {
  const reply = new Reply();
  reply.sentAt = sentAt;
  reply.waiting = "Waiting for the node…";
  reply.ticker = setInterval(() => reply.render(), 1000);
  reply.render();
  return reply;
}

class Reply {
  constructor() {
    this.content = "";
    this.reasoning = "";
    this.calls = [];
    this.stats = null;
    this.error = null;
    this.finish = null;
    this.usage = null;
    this.firstTokenAt = null;
    this.pendingRender = null;
    this.status = h("div", { class: "reply-status", role: "status" });
    this.thinking = h("details", { class: "reasoning", hidden: true }, h("summary", {}, "Reasoning"),
      h("div", { class: "muted text" }));
    this.text = h("div", { class: "markdown" });
    this.callList = h("ol", { class: "tool-calls", "aria-label": "Tool calls" });
    this.problem = h("p", { class: "error", role: "alert" });
    this.footer = h("p", { class: "muted footer" });
    this.element = h("li", { class: "message message-assistant" }, h("span", { class: "role" }, "assistant"),
      this.status, this.thinking, this.text, this.callList, this.problem, this.footer);
  }

  // An SSE comment from the node while the request waits: ": queued" or ": prefill 2048/18752 tokens (0 cached)".
  comment(text) {
    if (this.firstTokenAt !== null) return;
    this.waiting = text;
    this.render();
  }

  take(chunk) {
    if (chunk.error) {
      this.error = chunk.error.message ?? JSON.stringify(chunk.error);
      this.render();
      return;
    }
    if (chunk.usage) this.usage = chunk.usage;
    for (const choice of chunk.choices ?? []) {
      const delta = choice.delta ?? {};
      if (delta.reasoning_content || delta.content || delta.tool_calls?.length) {
        this.firstTokenAt ??= performance.now();
        this.waiting = null;
      }
      if (delta.reasoning_content) this.reasoning += delta.reasoning_content;
      if (delta.content) this.content += delta.content;
      for (const part of delta.tool_calls ?? []) this.takeToolCall(part);
      if (choice.finish_reason) this.finish = choice.finish_reason;
      // A call is drawn at each delta (the name, then the arguments filling in); text is drawn in batches.
      if (delta.tool_calls?.length) this.render();
    }
    this.scheduleRender();
  }

  takeToolCall(part) {
    const call = (this.calls[part.index] ??= { id: "", name: "", arguments: "" });
    if (part.id) call.id = part.id;
    if (part.function?.name) call.name += part.function.name;
    if (part.function?.arguments) call.arguments += part.function.arguments;
  }

  fail(reason) {
    this.error = reason;
  }

  // The end of the stream (finished, failed or stopped): the figures measured here, and the turn to keep.
  end() {
    clearInterval(this.ticker);
    const endedAt = performance.now();
    const tokens = this.usage?.completion_tokens ?? null;
    const decodeSeconds = this.firstTokenAt === null ? 0 : (endedAt - this.firstTokenAt) / 1000;
    this.stats = {
      ttft_seconds: this.firstTokenAt === null ? null : (this.firstTokenAt - this.sentAt) / 1000,
      // As the node's request log counts it: the first token ends the prefill, the speed is of those after it.
      tokens_per_second: tokens > 1 && decodeSeconds > 0 ? (tokens - 1) / decodeSeconds : null,
      completion_tokens: tokens,
      prompt_tokens: this.usage?.prompt_tokens ?? null,
      cached_tokens: this.usage?.prompt_tokens_details?.cached_tokens ?? null,
      finish_reason: this.finish,
    };
    this.waiting = null;
    this.render();
    const calls = this.calls.filter(Boolean);
    return {
      role: "assistant", content: this.content || null, reasoning: this.reasoning || undefined,
      tool_calls: calls.length ? calls.map((call) => ({ id: call.id, type: "function",
        function: { name: call.name, arguments: call.arguments } })) : undefined,
      stats: this.stats, error: this.error ?? undefined,
    };
  }

  produced() {
    return Boolean(this.content || this.calls.some(Boolean));
  }

  scheduleRender() {
    if (this.pendingRender === null) this.pendingRender = setTimeout(() => this.render(), RENDER_EVERY_MS);
  }

  render() {
    clearTimeout(this.pendingRender);
    this.pendingRender = null;
    fill(this.status, this.waiting === null ? [] : waitingView(this.waiting, this.sentAt));
    this.thinking.hidden = !this.reasoning;
    this.thinking.lastChild.textContent = this.reasoning;
    fill(this.text, renderMarkdown(this.content));
    fill(this.callList, this.calls.filter(Boolean).map(toolCallView));
    this.problem.textContent = this.error ? `Error: ${this.error}` : "";
    fill(this.footer, this.stats ? statsLine(this.stats) : this.waiting === null ? "streaming…" : "");
    this.element.dispatchEvent(new Event("reply-changed", { bubbles: true }));
  }
}

function waitingView(waiting, sentAt) {
  const waited = `${Math.floor((performance.now() - sentAt) / 1000)} s`;
  const prefill = PREFILL.exec(waiting);
  if (!prefill) {
    const said = waiting === "queued" ? "Queued behind other requests" : waiting;
    return h("p", { class: "muted" }, `${said} · ${waited}`);
  }
  const [done, total, cached] = [Number(prefill[1]), Number(prefill[2]), Number(prefill[3] ?? 0)];
  return h("p", { class: "muted prefill" },
    h("progress", { max: total, value: done, "aria-label": "Prompt read" }),
    ` Reading the prompt: ${done} of ${total} tokens`, cached ? ` (${cached} from the cache)` : "", ` · ${waited}`);
}

function statsLine(stats) {
  const parts = [];
  if (stats.ttft_seconds !== null) parts.push(h("span", { class: "ttft" }, `TTFT ${seconds(stats.ttft_seconds)}`));
  if (stats.tokens_per_second !== null) {
    parts.push(h("span", { class: "speed" }, `${number(stats.tokens_per_second)} tok/s`));
  }
  if (stats.completion_tokens !== null) parts.push(`${stats.completion_tokens} tokens`);
  if (stats.prompt_tokens !== null) {
    parts.push(`prompt ${stats.prompt_tokens}${stats.cached_tokens ? ` (${stats.cached_tokens} cached)` : ""}`);
  }
  if (stats.finish_reason) parts.push(`finish: ${stats.finish_reason}`);
  return parts.flatMap((part, index) => (index ? [" · ", part] : [part]));
}

// A tool call: its name, then its arguments, laid out as JSON once they parse (as they stream, the raw text).
function toolCallView(call) {
  let shown = call.arguments;
  try {
    shown = JSON.stringify(JSON.parse(call.arguments), null, 2);
  } catch {
    // not complete yet (or not JSON): shown as it came
  }
  return h("li", { class: "tool-call" }, h("span", { class: "muted" }, "calls "), h("strong", { class: "tool-name" },
    call.name), " ", h("span", { class: "muted call-id" }, call.id), h("pre", { class: "tool-arguments code" }, shown));
}
