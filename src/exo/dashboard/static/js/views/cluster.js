// Cluster view: one card per node (health, memory, accelerator and BLAS, runners, preparations) and a map of how
// the nodes are linked: every node's events go through the master, and a model split over nodes forms a ring.
import { badge, fill, h, section } from "../dom.js";
import { ago, bytes, layers, shortId } from "../format.js";

export function createClusterView() {
  const cards = h("div", { class: "cards", role: "list", "aria-label": "Nodes" });
  const map = h("div", { class: "links" });
  const element = section("cluster", "Cluster", cards, h("h3", {}, "Links"), map);
  return {
    element,
    update(snapshot) {
      fill(cards, snapshot.nodes.data.map((node) => nodeCard(node, snapshot.state)));
      fill(map, linkMap(snapshot));
    },
  };
}

function nodeCard(node, state) {
  const runners = Object.values(state.runners).filter((runner) => runner.node_id === node.node_id);
  const info = state.nodes[node.node_id];
  const used = node.memory_total_bytes - node.memory_available_bytes;
  const blas = describeBlas(runners.map((runner) => runner.metadata?.blas).filter(Boolean));
  const preparations = Object.values(info?.preparations ?? {});
  return h("article", {
    class: `card node node-${node.status}`, role: "listitem", "data-node-id": node.node_id,
    "data-status": node.status, "aria-label": `node ${node.display_name}`,
  },
  h("h3", {}, node.display_name, " ", node.is_master ? badge("master") : null, " ", badge(node.status)),
  node.reason ? h("p", { class: "reason" }, node.reason) : null,
  h("dl", {},
    h("dt", {}, "id"), h("dd", { title: node.node_id }, shortId(node.node_id)),
    h("dt", {}, "memory"), h("dd", {},
      h("meter", { min: 0, max: node.memory_total_bytes, value: used, "aria-label": `memory used on ${node.display_name}` }),
      ` ${bytes(used)} used, ${bytes(node.memory_available_bytes)} free of ${bytes(node.memory_total_bytes)}`),
    h("dt", {}, "device"), h("dd", {}, `${node.device} · mlx ${node.mlx_backend}`),
    h("dt", {}, "weights"), h("dd", {}, `held as ${node.weights_in_memory}`),
    h("dt", {}, "BLAS"), h("dd", {}, blas || "– (no runner has loaded here)"),
    h("dt", {}, "cluster port"), h("dd", {}, node.cluster_endpoints.join(", ") || "–"),
    h("dt", {}, "API port"), h("dd", {}, String(node.api_port)),
    h("dt", {}, "last seen"), h("dd", {}, ago(node.last_seen)),
    h("dt", {}, "version"), h("dd", {}, node.exo_version)),
  h("h4", {}, "Runners"),
  runners.length
    ? h("ul", { class: "runners" }, runners.map((runner) => h("li", {},
      h("strong", {}, runner.model_id), " ", badge(runner.status),
      ` rank ${runner.shard.rank} of ${runner.shard.world_size}`,
      runner.shard.world_size > 1 ? ` · layers ${layers(runner.shard.start_layer, runner.shard.end_layer)}` : "",
      runner.metadata?.weights_bytes ? ` · weights ${bytes(runner.metadata.weights_bytes)}` : "",
      runner.resident_bytes ? ` · resident ${bytes(runner.resident_bytes)}` : "",
      prefixCache(runner.memory?.prefix_cache),
      runner.restarts ? ` · ${runner.restarts} restarts` : "",
      runner.last_error ? h("div", { class: "error" }, runner.last_error) : null)))
    : h("p", { class: "muted" }, node.serves_models ? "none yet" : "none (--no-model)"),
  preparations.length ? [h("h4", {}, "Preparations"), h("ul", {}, preparations.map(preparationItem))] : null,
  node.preparing.length ? h("p", { class: "muted" }, `resolving ${node.preparing.join(", ")}`) : null);
}

// What a runner's prefix cache holds: in memory, queued for disk (held in memory until written), on disk.
function prefixCache(usage) {
  if (!usage) return "";
  const queued = usage.queued_bytes ? `, ${bytes(usage.queued_bytes)} queued` : "";
  return ` · prefix cache ${bytes(usage.memory_bytes)}${queued}, ${bytes(usage.disk_bytes)} on disk`;
}

export function preparationItem(preparation) {
  const share = preparation.total_bytes ? preparation.done_bytes / preparation.total_bytes : 0;
  return h("li", {},
    h("strong", {}, preparation.model_id), ` ${preparation.phase} `,
    preparation.phase === "ready" || preparation.phase === "failed" ? null
      : h("progress", { max: 1, value: share, "aria-label": `${preparation.model_id} ${preparation.phase}` }),
    ` ${bytes(preparation.done_bytes)} of ${bytes(preparation.total_bytes)}`,
    preparation.seconds_left ? `, ${Math.round(preparation.seconds_left)} s left` : "",
    preparation.error ? h("div", { class: "error" }, preparation.error) : null);
}

// Each runner measures its BLAS when it loads: one line per library, with the range of what the runners measured.
function describeBlas(reports) {
  const byLibrary = new Map();
  for (const blas of reports) {
    const threads = blas.threading ? ` (${blas.threading} threads)` : "";
    const name = `${blas.kind} from ${blas.source}${threads}`;
    byLibrary.set(name, [...(byLibrary.get(name) ?? []), Math.round(blas.matmul_gflops)]);
  }
  return [...byLibrary].map(([name, speeds]) => {
    const low = Math.min(...speeds);
    const high = Math.max(...speeds);
    return `${name}: ${low === high ? low : `${low}–${high}`} GFLOP/s`;
  }).join("; ");
}

// An SVG map: nodes on a circle, a dashed line from every live node to the master (the cluster's events flow
// there), and a solid line between the nodes of each model split over several nodes (its pipeline ring).
function linkMap(snapshot) {
  const nodes = snapshot.nodes.data;
  const size = 320;
  const radius = nodes.length > 1 ? 110 : 0;
  const centre = size / 2;
  const position = new Map(nodes.map((node, index) => {
    const angle = (2 * Math.PI * index) / nodes.length - Math.PI / 2;
    return [node.node_id, [centre + radius * Math.cos(angle), centre + radius * Math.sin(angle)]];
  }));
  const master = nodes.find((node) => node.is_master);
  const lines = [];
  const described = [];
  for (const node of nodes) {
    if (!master || node === master || node.status === "down") continue;
    lines.push(svgLine(position.get(node.node_id), position.get(master.node_id), "link-events"));
    described.push(`${node.display_name} → ${master.display_name} (master): cluster events`);
  }
  for (const instance of snapshot.instances.data) {
    const ranks = instance.ranks;
    const pairs = ranks.length < 2 ? 0 : ranks.length === 2 ? 1 : ranks.length;
    for (let index = 0; index < pairs; index += 1) {
      const from = ranks[index];
      const to = ranks[(index + 1) % ranks.length];
      lines.push(svgLine(position.get(from.node_id), position.get(to.node_id), "link-ring"));
      described.push(`${from.node_name} ⇄ ${to.node_name}: ${instance.model_id} pipeline ring`
        + ` (rank ${from.rank} ⇄ rank ${to.rank})`);
    }
  }
  const svg = svgElement("svg", { viewBox: `0 0 ${size} ${size}`, role: "img", "aria-labelledby": "links-list" });
  svg.append(...lines.filter(Boolean));
  for (const node of nodes) {
    const [x, y] = position.get(node.node_id);
    const group = svgElement("g", { class: `map-node node-${node.status}` });
    group.append(svgElement("circle", { cx: x, cy: y, r: 26 }));
    const label = svgElement("text", { x, y: y + 4, "text-anchor": "middle" });
    label.textContent = node.display_name.slice(0, 10);
    group.append(label);
    svg.append(group);
  }
  return [svg, h("ul", { id: "links-list", class: "legend" },
    described.length ? described.map((text) => h("li", {}, text))
      : h("li", {}, nodes.length > 1 ? "no links: the other nodes are down" : "a single node: no links"))];
}

function svgLine(from, to, kind) {
  if (!from || !to) return null;
  return svgElement("line", { x1: from[0], y1: from[1], x2: to[0], y2: to[1], class: kind });
}

function svgElement(tag, attributes) {
  const element = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, String(value));
  return element;
}
