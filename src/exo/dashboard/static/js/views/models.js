// Models view: this node's catalog (download with live progress), every node's preparations, placing a model over
// N nodes (the refusal shown in words), and where each model runs: placed instances with their ranks and layers.
import { getJson, request, serverSentEvents } from "../api.js";
import { badge, fill, h, section, table } from "../dom.js";
import { ago, bytes, layers, shortId } from "../format.js";
import { preparationItem } from "./cluster.js";

export function createModelsView() {
  const catalog = h("div", {}, h("p", { class: "muted" }, "loading the catalog…"));
  const catalogStatus = h("p", { role: "status", class: "muted" });
  const preparations = h("div");
  const modelInput = h("input", { id: "place-model", name: "model", required: true, list: "place-models",
    autocomplete: "off", placeholder: "catalog id or served model" });
  const suggestions = h("datalist", { id: "place-models" });
  const minNodes = h("input", { id: "place-min-nodes", name: "min_nodes", type: "number", min: 1, value: "1",
    required: true, inputmode: "numeric" });
  const parallel = h("select", { id: "place-parallel", name: "parallel" },
    ["auto", "pipeline", "tensor"].map((value) => h("option", { value }, value)));
  const placeButton = h("button", { type: "submit" }, "Place");
  const placeResult = h("div", { id: "place-result", "aria-live": "polite" });
  const form = h("form", { class: "inline-form", "aria-label": "Place a model", onsubmit: place },
    h("label", { for: "place-model" }, "Model"), modelInput, suggestions,
    h("label", { for: "place-min-nodes" }, "Over at least N nodes"), minNodes,
    h("label", { for: "place-parallel" }, "Split"), parallel, placeButton);
  const instances = h("div");
  const unplaced = h("div");
  const served = h("div");
  const element = section("models", "Models",
    h("h3", {}, "Catalog of this node"), catalogStatus, catalog,
    h("h3", {}, "Preparations"), preparations,
    h("h3", {}, "Place a model"),
    h("p", { class: "muted" }, "Splits the model over the fewest nodes whose free memory holds it: by layers "
      + "(pipeline), or every node running every layer with a share of its heads (tensor); auto splits by layers (a tensor split waits on the link twice per layer, every token)."),
    form, placeResult,
    h("h3", {}, "Placed instances"), instances,
    h("h3", {}, "Waiting to be placed"), unplaced,
    h("h3", {}, "Served models"), served);
  let catalogIds = [];
  let servedIds = [];

  async function loadCatalog() {
    try {
      const answer = await getJson("/v1/catalog");
      catalogIds = answer.models.map((model) => model.listing.entry.model_id);
      fill(catalog, catalogTable(answer.models));
      updateSuggestions();
    } catch (error) {
      fill(catalog, h("p", { class: "error", role: "alert" }, `The catalog could not be read: ${error.message}`));
    }
  }

  // How this node holds weights (its --cpu-weights on a Linux CPU; as the checkpoint stores them elsewhere).
  function weightsLabel(weights) {
    return weights === "stored" ? "stored" : weights;
  }

  function catalogTable(models) {
    return table("Model catalog",
      ["Model", "Family", "Parameters", "Download", "On disk", "Memory to serve", "Tool format", "On this node"],
      models.map(({ listing, memory_bytes: memory, weights_in_memory: weights }) => {
        const entry = listing.entry;
        const progress = h("span", { class: "download-progress", "aria-live": "polite" });
        const action = listing.downloaded ? badge("downloaded", "ready")
          : h("button", { type: "button", "aria-label": `Download ${entry.model_id}`,
            onclick: (event) => download(entry.model_id, event.target, progress) }, "Download");
        return [entry.model_id, entry.family, entry.parameters,
          entry.source.installed_with_exo ? "installed with exo" : bytes(entry.source.pieces.reduce(
            (sum, piece) => sum + piece.size, 0)),
          bytes(entry.imported_bytes), `${bytes(memory)} as ${weightsLabel(weights)}`, entry.tool_format, h("span", {}, action, progress)];
      }));
  }

  async function download(modelId, button, progress) {
    button.disabled = true;
    fill(progress, " starting…");
    try {
      const response = await request("/v1/catalog/download", { method: "POST", body: { model: modelId } });
      if (!response.ok) throw new Error((await response.json()).error.message);
      for await (const { data } of serverSentEvents(response)) {
        const event = JSON.parse(data);
        if (event.type === "progress") fill(progress, h("ul", { class: "plain" }, preparationItem(event.preparation)));
        else if (event.type === "error") throw new Error(event.error.message);
        else if (event.type === "done") fill(catalogStatus, `${modelId} is downloaded.`);
      }
      await loadCatalog();
    } catch (error) {
      button.disabled = false;
      fill(progress, h("span", { class: "error", role: "alert" }, ` ${error.message}`));
    }
  }

  async function place(event) {
    event.preventDefault();
    placeButton.disabled = true;
    fill(placeResult, h("p", { role: "status" }, `placing ${modelInput.value}…`));
    try {
      const instance = await getJson("/v1/cluster/instances", {
        method: "POST",
        body: { model: modelInput.value.trim(), min_nodes: Number(minNodes.value), parallel: parallel.value },
      });
      fill(placeResult, h("p", { role: "status" },
        `Placed ${instance.model_id} as instance ${instance.instance_id} over ${instance.world_size} node(s).`));
    } catch (error) {
      fill(placeResult, h("p", { class: "error", role: "alert" }, `Not placed: ${error.message}`));
    } finally {
      placeButton.disabled = false;
    }
  }

  function updateSuggestions() {
    const ids = [...new Set([...catalogIds, ...servedIds])];
    fill(suggestions, ids.map((id) => h("option", { value: id })));
  }

  loadCatalog();
  return {
    element,
    shown: loadCatalog,
    update(snapshot) {
      const preparing = Object.values(snapshot.state.nodes).flatMap((node) =>
        Object.values(node.preparations).map((preparation) => [node.display_name || node.facts.name, preparation]));
      fill(preparations, preparing.length
        ? h("ul", {}, preparing.map(([name, preparation]) => {
          const item = preparationItem(preparation);
          item.prepend(`${name}: `);
          return item;
        }))
        : h("p", { class: "muted" }, "none"));
      fill(instances, snapshot.instances.data.length
        ? snapshot.instances.data.map(instanceCard)
        : h("p", { class: "muted" }, "none: models started with --model run whole on their node (below)"));
      fill(unplaced, table("Waiting to be placed", ["Model", "Over at least", "Why", "Since"],
        (snapshot.instances.unplaced ?? []).map((pending) => [pending.model_id, `${pending.min_nodes} nodes`,
          h("span", { class: "reason" }, pending.reason), ago(pending.since)]),
        "none: every model the cluster keeps placed has an instance"));
      servedIds = snapshot.summary.models.map((model) => model.model_id);
      updateSuggestions();
      fill(served, table("Served models", ["Model", "Instance", "Node", "Rank", "Layers", "Status"],
        snapshot.summary.models.flatMap((model) => model.instances.map((instance) => [
          model.model_id, shortId(instance.instance_id), instance.node_name,
          `${instance.rank} of ${instance.world_size}`, layers(instance.start_layer, instance.end_layer),
          badge(instance.status)]))));
    },
  };
}

function instanceCard(instance) {
  return h("article", { class: "card instance", "data-instance-id": instance.instance_id,
    "aria-label": `instance ${instance.instance_id} of ${instance.model_id}` },
  h("h4", {}, instance.model_id, " ", badge(instance.ready ? "ready" : "starting", instance.ready ? "ready" : "loading"),
    instance.degraded ? [" ", badge("degraded")] : null,
    h("span", { class: "muted" }, ` instance ${instance.instance_id} · ${instance.world_size} of at least `
      + `${instance.min_nodes} nodes · ${instance.parallel ?? "pipeline"} parallel`)),
  instance.degraded_reason ? h("p", { class: "reason" }, instance.degraded_reason) : null,
  instance.replaces ? h("p", { class: "muted" }, `takes over from instance ${instance.replaces} once it serves`) : null,
  table(`Ranks of ${instance.model_id}`, ["Rank", "Node", "Layers", "Planned memory", "Runner", "Status"],
    instance.ranks.map((rank) => [
      `rank ${rank.rank}`, rank.node_name, layers(rank.start_layer, rank.end_layer), bytes(rank.planned_bytes),
      rank.runner_id ? shortId(rank.runner_id) : "copying files",
      rank.status ? badge(rank.status) : badge("preparing", "loading")])));
}
