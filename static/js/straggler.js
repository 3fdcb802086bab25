// The straggler box of the run page (templates/experiments/_straggler.html). The sentence is the
// dashboard's (runs/stragglers.py): a `straggler` message when a rank is named, changes or
// clears, and the snapshot's texts after a reconnect; the page only shows it.
(function () {
  "use strict";
  const root = document.getElementById("experiment-detail");
  const box = document.getElementById("straggler-box");
  if (!root || !box) return;
  const text = document.getElementById("straggler-text");

  function show(sentence) {
    text.textContent = sentence || "";
    box.hidden = !sentence;
  }

  root.addEventListener("run:message", function (event) {
    const msg = event.detail;
    if (!msg || typeof msg !== "object") return;
    if (msg.type === "straggler") show(msg.straggler ? msg.text : "");
    else if (msg.type === "snapshot" && msg.texts) show(msg.texts.straggler);
  });
})();
