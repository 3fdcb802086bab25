// The stalled banner of the run page (templates/experiments/_stalled.html). What it says is the
// dashboard's: the row's `stalled` (runs/stalls.py) and each rank's line (core/stalls.py's
// texts), from the snapshot on every connect and from a `stalled` message when a stall begins
// or ends. An attempt that ends clears the row in its own transition, with no message of its
// own: its end hides the banner here. The page only places what it is sent, the words beside
// "Stop and resume from the last checkpoint" too (texts.resume: whether it can, and why not);
// the button posts to the run's resume route, whose refusal is said as the server words it.
(function () {
  "use strict";
  const root = document.getElementById("experiment-detail");
  const box = document.getElementById("stalled-box");
  if (!root || !box) return;
  const text = document.getElementById("stalled-text");
  const since = document.getElementById("stalled-since");
  const list = document.getElementById("stalled-ranks");
  const template = document.getElementById("stalled-rank-template");
  const resumeButton = document.getElementById("stalled-resume"); // owner or staff, while active
  const resumeText = document.getElementById("stalled-resume-text");
  const resumeError = document.getElementById("stalled-resume-error");
  let shown = null; // what the list holds: a stack someone opened stays open on a new snapshot
  let resumable = Boolean(resumeButton && !resumeButton.disabled);
  let stopping = false; // a Stop, or this button's, asked: this attempt ends either way
  // The attempt the banner shows: the request names it, so that a retry or a page left open
  // never stops a later attempt (the server refuses one that has moved on). A new attempt
  // starts with no Stop asked: the button follows its own stall again.
  let attempt = resumeButton ? Number(resumeButton.dataset.attempt) || 0 : 0;

  function attemptSeen(number) {
    if (typeof number !== "number" || number === attempt) return;
    attempt = number;
    stopping = false;
    if (resumeError) resumeError.hidden = true;
  }

  function resumeShow(offer) {
    if (!resumeButton) return;
    offer = offer && typeof offer === "object" ? offer : {};
    resumable = offer.resumable === true;
    resumeText.textContent = offer.text || "";
    resumeButton.disabled = stopping || !resumable;
  }

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
    resumeShow(texts.resume);
    box.hidden = !stalled;
  }

  async function resume() {
    const { csrfToken } = window.Trainyard;
    stopping = true;
    resumeButton.disabled = true;
    resumeError.hidden = true;
    try {
      const response = await fetch(root.dataset.resumeUrl, {
        method: "POST",
        credentials: "same-origin",
        headers: {
          "X-CSRFToken": csrfToken(),
          Accept: "application/json",
          "Content-Type": "application/json",
        },
        body: JSON.stringify({ attempt: attempt }),
      });
      if (response.ok) return; // the Stop shows as asked; the run's messages say the rest
      let body = {};
      try {
        body = await response.json();
      } catch (err) {
        body = {};
      }
      throw new Error(body.error || String(response.status));
    } catch (err) {
      stopping = false;
      resumeButton.disabled = !resumable;
      resumeError.textContent = err.message;
      resumeError.hidden = false;
    }
  }

  if (resumeButton) resumeButton.addEventListener("click", resume);

  root.addEventListener("run:message", function (event) {
    const msg = event.detail;
    if (!msg || typeof msg !== "object") return;
    if (msg.experiment) attemptSeen(msg.experiment.attempt);
    else if (msg.type === "status" && msg.status === "running") attemptSeen(msg.attempt);
    if (msg.experiment && msg.experiment.stop_requested && resumeButton) {
      stopping = true; // asked here or elsewhere: nothing left to resume from this page
      resumeButton.disabled = true;
    }
    if (msg.type === "stalled") show(msg.stalled, msg.texts);
    else if (msg.type === "snapshot" && msg.experiment) {
      show(msg.experiment.stalled, (msg.texts || {}).stalled);
    } else if (msg.type === "finished" || msg.type === "failed") show(null);
    else if (msg.type === "status" && msg.status && msg.status !== "running") show(null);
  });
})();
