// The stalled banner of the run page (templates/experiments/_stalled.html). What it says is the
// dashboard's: the row's `stalled` (runs/stalls.py) and each rank's line (core/stalls.py's
// texts), from the snapshot on every connect and from a `stalled` message when a stall begins
// or ends. An attempt that ends clears the row in its own transition, with no message of its
// own: its end hides the banner here. The page only places what it is sent.
(function () {
  "use strict";
  const root = document.getElementById("experiment-detail");
  const box = document.getElementById("stalled-box");
  if (!root || !box) return;
  const text = document.getElementById("stalled-text");
  const since = document.getElementById("stalled-since");
  const list = document.getElementById("stalled-ranks");
  const template = document.getElementById("stalled-rank-template");
  let shown = null; // what the list holds: a stack someone opened stays open on a new snapshot

  function rankItem(rank, line) {
    const item = template.content.firstElementChild.cloneNode(true);
    item.dataset.rank = rank.rank;
    item.querySelector(".stalled-line").textContent = line || "";
    item.querySelector(".stalled-stack pre").textContent = rank.stack || "";
    return item;
  }

  function show(stalled, texts) {
    stalled = stalled && typeof stalled === "object" ? stalled : null;
    texts = texts || {};
    const key = JSON.stringify([stalled, texts]);
    if (key === shown) return;
    shown = key;
    const ranks = stalled && Array.isArray(stalled.ranks) ? stalled.ranks : [];
    const lines = Array.isArray(texts.ranks) ? texts.ranks : [];
    text.textContent = stalled ? stalled.text || "" : "";
    since.textContent = texts.since || "";
    list.replaceChildren(...ranks.map((rank, i) => rankItem(rank, lines[i])));
    box.hidden = !stalled;
  }

  root.addEventListener("run:message", function (event) {
    const msg = event.detail;
    if (!msg || typeof msg !== "object") return;
    if (msg.type === "stalled") show(msg.stalled, msg.texts);
    else if (msg.type === "snapshot" && msg.experiment) {
      show(msg.experiment.stalled, (msg.texts || {}).stalled);
    } else if (msg.type === "finished" || msg.type === "failed") show(null);
    else if (msg.type === "status" && msg.status && msg.status !== "running") show(null);
  });
})();
