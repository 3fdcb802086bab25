// The study form (templates/studies/form.html): shows the part of "Runs" the chosen mode uses
// (the scaling preset or the axes editor). Without this script both show; the server reads the
// one the mode names.
(function () {
  "use strict";

  const form = document.getElementById("study-form");
  if (!form) return;
  const parts = form.querySelectorAll("[data-mode]");

  function show() {
    const chosen = form.querySelector('input[name="mode"]:checked');
    parts.forEach((part) => {
      part.hidden = chosen ? part.dataset.mode !== chosen.value : false;
    });
  }

  form.querySelectorAll('input[name="mode"]').forEach((input) => input.addEventListener("change", show));
  show();
})();
