// Reads the cluster every second through the public API and hands each snapshot to the views. A node that stops
// answering is reported, and polling goes on, so the page recovers when it is back.
import { getJson } from "./api.js";

export const POLL_INTERVAL_MS = 1000;

const SOURCES = {
  state: "/state",
  summary: "/v1/cluster",
  nodes: "/v1/cluster/nodes",
  instances: "/v1/cluster/instances",
  metrics: "/v1/cluster/metrics",
};

export function startPolling(onSnapshot, onFailure) {
  let stopped = false;
  async function tick() {
    try {
      const entries = await Promise.all(
        Object.entries(SOURCES).map(async ([name, path]) => [name, await getJson(path)]));
      onSnapshot({ ...Object.fromEntries(entries), at: Date.now() });
    } catch (error) {
      onFailure(error);
    }
    if (!stopped) setTimeout(tick, POLL_INTERVAL_MS);
  }
  tick();
  return () => { stopped = true; };
}
