// The page: navigation between the four views, the API key dialog, and the poll that feeds the views.
import { currentKey, onKeyNeeded, setKey } from "./api.js";
import { startPolling } from "./poller.js";
import { fill } from "./dom.js";
import { bytes } from "./format.js";
import { createClusterView } from "./views/cluster.js";
import { createModelsView } from "./views/models.js";
import { createActivityView } from "./views/activity.js";
import { createChatView } from "./views/chat.js";

const views = {
  cluster: createClusterView(),
  models: createModelsView(),
  activity: createActivityView(),
  chat: createChatView(),
};
const main = document.getElementById("main");
main.append(...Object.values(views).map((view) => view.element));

function show() {
  const name = location.hash.slice(1) in views ? location.hash.slice(1) : "cluster";
  for (const [viewName, view] of Object.entries(views)) view.element.hidden = viewName !== name;
  for (const link of document.querySelectorAll("nav a")) {
    if (link.hash === `#${name}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  views[name].shown?.();
}
window.addEventListener("hashchange", show);
show();

// The key dialog: opened by the first refused call (or the header button), resolved when a key is entered.
const dialog = document.getElementById("key-dialog");
const keyInput = document.getElementById("key-input");
const keyError = document.getElementById("key-error");
let keyWaiters = [];
function askForKey(wasRefused) {
  // A node that asks for a key is answering: an earlier "not answering" banner must not stay behind the dialog.
  document.getElementById("connection").hidden = true;
  keyError.textContent = wasRefused ? "That key was refused: check it and try again." : "";
  keyInput.value = "";
  if (!dialog.open) dialog.showModal();
  keyInput.focus();
  return new Promise((resolve) => keyWaiters.push(resolve));
}
dialog.addEventListener("close", () => {
  const key = keyInput.value.trim();
  if (!key) {
    // Escape closes a modal dialog; the calls that need a key still wait for one.
    if (keyWaiters.length) dialog.showModal();
    return;
  }
  for (const resolve of keyWaiters) resolve(key);
  keyWaiters = [];
});
onKeyNeeded(askForKey);
// Shown once a key is in use, to change it.
const keyButton = document.getElementById("key-button");
keyButton.hidden = currentKey() === null;
keyButton.addEventListener("click", () => askForKey(false).then(setKey));

const clusterLine = document.getElementById("cluster-line");
const connection = document.getElementById("connection");
startPolling(
  (snapshot) => {
    connection.hidden = true;
    keyButton.hidden = currentKey() === null;
    const { summary } = snapshot;
    const master = snapshot.nodes.data.find((node) => node.is_master);
    fill(clusterLine,
      `cluster ${summary.cluster} · ${summary.nodes_healthy} healthy, ${summary.nodes_degraded} degraded, `
      + `${summary.nodes_down} down · master ${master ? master.display_name : "none"} · `
      + `${bytes(summary.memory_available_bytes)} free of ${bytes(summary.memory_total_bytes)}`);
    for (const view of Object.values(views)) view.update(snapshot);
  },
  (error) => {
    // While the key dialog is open the node has answered (with a 401); a poll that failed before that answer
    // can still arrive after it, and must not put a stale banner behind the dialog.
    if (dialog.open) return;
    connection.hidden = false;
    connection.textContent = `This node is not answering (${error.message}); retrying every second.`;
  },
);
