// Activity view: requests in flight, recently ended ones (dialect, node, outcome, prompt and cached tokens, time
// to first token, decode speed, error: as the node whose API took each recorded it), queue depth, per-model
// figures, and the cluster's generated tokens per second over the last two minutes: each poll's sum of the nodes'
// `tokens_per_second_now` (their runners count tokens as they are produced, over the last few seconds).
import { badge, fill, h, section, table } from "../dom.js";
import { ago, number, seconds, shortId } from "../format.js";

const CHART_SAMPLES = 120;
// Fields every task has; any other field a node reports about a task (its phase, prefill progress, cached
// tokens…) is shown as it comes, so newer nodes' details appear without a page change.
const TASK_FIELDS = new Set(["task_id", "model_id", "runner_id", "node_id", "requested_by", "status", "created_at"]);
const RECENT_SHOWN = 20;

export function createActivityView() {
  const totals = h("div", { class: "totals", "aria-live": "off" });
  const chart = h("figure", { class: "chart" });
  const inFlight = h("div");
  const recent = h("div");
  const perModel = h("div");
  const element = section("activity", "Activity", totals,
    h("h3", {}, "Generated tokens per second"), chart,
    h("h3", {}, "Requests in flight"), inFlight,
    h("h3", {}, "Recent requests"), recent,
    h("h3", {}, "Per model"), perModel);
  const samples = [];
  return {
    element,
    update(snapshot) {
      const { state, metrics } = snapshot;
      const names = Object.fromEntries(Object.values(state.nodes).map((node) => [node.facts.node_id, node.display_name || node.facts.name]));
      const sum = (field) => metrics.nodes.reduce((total, node) => total + (node[field] ?? 0), 0);
      samples.push(sum("tokens_per_second_now"));
      if (samples.length > CHART_SAMPLES) samples.shift();
      fill(totals, [
        ["running", sum("tasks_running")], ["queued", sum("queue_depth")], ["finished", sum("requests_finished")],
        ["failed", sum("requests_failed")], ["cancelled", sum("requests_cancelled")],
        ["tok/s now", number(samples.at(-1) ?? 0)],
      ].map(([label, value]) => h("div", { class: "total" }, h("span", { class: "value" }, String(value)),
        h("span", { class: "label" }, label))));
      fill(chart, lineChart(samples));
      const tasks = Object.values(state.tasks).sort((a, b) => a.created_at - b.created_at);
      fill(inFlight, table("Requests in flight", ["Task", "Model", "Node", "Asked at", "Phase", "Age", "Details"],
        tasks.map((task) => [shortId(task.task_id), task.model_id, names[task.node_id] ?? shortId(task.node_id),
          names[task.requested_by] ?? shortId(task.requested_by), badge(task.phase ?? task.status, task.status),
          seconds(Date.now() / 1000 - task.created_at), details(task, TASK_FIELDS)]), "none right now"));
      // Each node lists the requests its API took; here they are merged, newest first.
      const ended = Object.values(state.nodes).flatMap((node) => node.recent_requests.map((request) => ({
        ...request, took: node.display_name || node.facts.name, served: names[request.served_by] ?? shortId(request.served_by) })))
        .sort((a, b) => b.ended_at - a.ended_at).slice(0, RECENT_SHOWN);
      fill(recent, table("Recent requests",
        ["Ended", "Dialect", "Model", "Node", "Outcome", "Prompt", "TTFT", "Output", "Decode tok/s", "Error"],
        ended.map((request) => [ago(request.ended_at), request.dialect, request.model_id,
          request.took === request.served ? request.took : `${request.took} → ${request.served}`,
          badge(request.finish_reason ?? request.outcome, request.outcome), promptCell(request),
          seconds(request.time_to_first_token_seconds), number(request.completion_tokens),
          number(request.decode_tokens_per_second),
          request.error ? h("span", { class: "error" }, request.error_kind ? `${request.error_kind}: ` : "", request.error)
            : "–"]),
        "none yet"));
      fill(perModel, table("Per model",
        ["Model", "Finished", "Failed", "Cancelled", "Prompt tokens", "Generated", "TTFT", "Decode tok/s", "Running",
          "Queued"],
        metrics.models.map((model) => [model.model_id, model.requests_finished, model.requests_failed,
          model.requests_cancelled, model.prompt_tokens, model.generated_tokens,
          seconds(model.time_to_first_token_seconds), number(model.decode_tokens_per_second), model.tasks_running,
          model.queue_depth].map(String))));
    },
  };
}

// A recent request's prompt: its tokens, and how many the prefix cache gave (and of those, its disk tier).
function promptCell(request) {
  if (request.prompt_tokens === null) return "–";
  const disk = request.disk_cached_tokens ? ` (${request.disk_cached_tokens} from disk)` : "";
  return `${request.prompt_tokens} tokens, ${request.cached_tokens ?? 0} cached${disk}`;
}

// How far a running task has read its prompt (where its node reports it), then its other fields as "name value".
function details(task, known) {
  const parts = [];
  const prompt = task.prompt_tokens;
  if (typeof prompt === "number" && typeof task.done_tokens === "number") {
    parts.push(h("span", { class: "detail" }, "prompt ",
      h("progress", { max: prompt || 1, value: task.done_tokens, "aria-label": `prompt read of task ${task.task_id}` }),
      ` ${task.done_tokens}/${prompt} tokens`, task.cached_tokens ? `, ${task.cached_tokens} cached` : ""));
  }
  const shown = new Set(parts.length ? ["prompt_tokens", "done_tokens", "cached_tokens"] : []);
  for (const [name, value] of Object.entries(task)) {
    if (known.has(name) || shown.has(name) || value === null || value === undefined || name === "phase") continue;
    const label = name.replaceAll("_", " ");
    if (value && typeof value === "object" && "done" in value && "total" in value) {
      parts.push(h("span", { class: "detail" }, `${label} `,
        h("progress", { max: value.total || 1, value: value.done, "aria-label": label }), ` ${value.done}/${value.total}`));
    } else {
      const shown = typeof value === "number" ? number(value, 2) : typeof value === "object" ? JSON.stringify(value)
        : String(value);
      parts.push(h("span", { class: "detail" }, `${label} ${shown}`));
    }
  }
  return parts.length ? parts : "–";
}

function lineChart(values) {
  const width = 600;
  const height = 120;
  const peak = Math.max(0, ...values);
  const top = Math.max(1, peak);
  const step = width / (CHART_SAMPLES - 1);
  const offset = width - (values.length - 1) * step;
  const points = values.map((value, index) =>
    `${(offset + index * step).toFixed(1)},${(height - (value / top) * (height - 10)).toFixed(1)}`).join(" ");
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `generated tokens per second, last ${values.length} seconds, peak ${number(peak)}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points);
  svg.append(line);
  return [svg, h("figcaption", { class: "muted" },
    `peak ${number(peak)} tok/s over the last ${values.length} s (all runners of the cluster)`)];
}
