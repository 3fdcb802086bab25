// The silence box of a run reported from outside (templates/experiments/_silence.html). A script
// that stops posting sends no message to say so, so while the run runs the page reads its JSON
// again now and then; the sentence (silence_text, "" while it is heard from) is the dashboard's.
(function () {
  "use strict";
  const root = document.getElementById("experiment-detail");
  const box = document.getElementById("silence-box");
  if (!root || !box) return;
  const text = document.getElementById("silence-text");
  const facts = Trainyard.facts;
  let status = null;

  function show(experiment) {
    if (!experiment || typeof experiment !== "object") return;
    if (experiment.status) status = experiment.status;
    if ("silence_text" in experiment) {
      text.textContent = experiment.silence_text || "";
      box.hidden = !experiment.silence_text;
    }
  }

  async function read() {
    if (status && facts.final_statuses.includes(status)) return;
    try {
      const response = await fetch(root.dataset.apiUrl, {
        credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store",
      });
      if (response.ok) show(await response.json());
    } catch (err) {
      // The next read tries again.
    }
  }

  root.addEventListener("run:message", function (event) {
    const msg = event.detail;
    if (!msg || typeof msg !== "object") return;
    if (msg.type === "snapshot") show(msg.experiment);
    else if (msg.type === "status" && msg.status) status = msg.status;
    else if (msg.type === "finished" || msg.type === "failed") show({ status: msg.status, silence_text: "" });
    // The script's own figures and lines: it is heard from again.
    else if (msg.type === "series" || msg.type === "log") show({ silence_text: "" });
  });
  setInterval(read, 1000 * Number(box.dataset.pollSeconds || 15));
})();
