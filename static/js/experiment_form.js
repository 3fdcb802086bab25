// Launch form: shows the help line of the chosen strategy only, dims the processes field unless
// the strategy starts several processes and the machines field unless it can span machines, and
// shows each strategy option (ZeRO's stage, DDP's comm hook, ...) for the strategies that read
// it, and a user's own script's fields in place of the engine's. Without this script every line
// and field stays visible (the server ignores what a strategy does not use at its default, and
// refuses the rest with the reason).
(function () {
  "use strict";

  const form = document.getElementById("experiment-form");
  if (!form) return;
  const strategy = form.elements.namedItem("strategy");
  const helpList = document.getElementById("strategy-help");
  const processesField = form.querySelector(".ddp-only");
  const optionFields = form.querySelectorAll(".strategy-option");
  const optionsSet = document.getElementById("strategy-options");
  // Machines: only strategies that can span several (the page facts' `nodes`) read it.
  const nodesField = document.getElementById("field-nodes");
  // Attributes through getAttribute: `form.dataset` is the form's "dataset" field, not its data-*.
  // The strategies that take a process count (training/registry.py), written by the server.
  const processStrategies = new Set((form.getAttribute("data-process-strategies") || "").split(" "));
  if (!strategy) return;

  function sync() {
    const value = strategy.value;
    if (helpList) {
      helpList.classList.add("single-line");
      for (const item of helpList.querySelectorAll("li[data-strategy]")) {
        item.hidden = item.dataset.strategy !== value;
      }
    }
    if (processesField) {
      const relevant = processStrategies.has(value);
      processesField.classList.toggle("is-dimmed", !relevant);
      const input = processesField.querySelector("input");
      if (input) {
        // Still submitted (the server ignores it), but out of the way.
        input.tabIndex = relevant ? 0 : -1;
        input.setAttribute("aria-disabled", relevant ? "false" : "true");
      }
    }
  }

  function syncNodes() {
    if (!nodesField || !window.Trainyard) return;
    const spec = Trainyard.facts.strategies[strategy.value];
    nodesField.classList.toggle("is-dimmed", !(spec && spec.nodes));
  }

  function syncOptions() {
    if (!window.Trainyard) return;
    // The options the chosen strategy reads (training/registry.py, from the page facts).
    const spec = Trainyard.facts.strategies[strategy.value];
    const read = new Set(spec ? spec.options : []);
    let shown = 0;
    for (const field of optionFields) {
      const input = field.querySelector("[name]");
      const relevant = Boolean(input) && read.has(input.name);
      // Hidden, not dimmed, and disabled so that it is not sent: the server refuses an option
      // set for a strategy that does not read it. Its value stays for a switch back.
      field.hidden = !relevant;
      if (input) input.disabled = !relevant;
      if (relevant) shown += 1;
    }
    if (optionsSet) optionsSet.hidden = shown === 0;
  }

  // Models, datasets and image folders: what the online workers have, as the server sent it
  // (#launch-options, catalogue_options.launch_options); this script keeps no list of its own.
  const optionsNode = document.getElementById("launch-options");
  const options = optionsNode ? JSON.parse(optionsNode.textContent) : null;
  const model = form.elements.namedItem("model");
  const dataset = form.elements.namedItem("dataset");
  const folder = form.elements.namedItem("data_path");
  const folderField = form.querySelector(".imagefolder-only");
  const modelExplain = document.getElementById("model-explain");
  const datasetExplain = document.getElementById("dataset-explain");

  function syncCatalogue() {
    if (!options) return;
    if (model && modelExplain) {
      const group = options.model_groups.find((g) => g.models.includes(model.value));
      // A built-in model has a line of its own; the others their source's.
      const own = group && group.model_help && group.model_help[model.value];
      modelExplain.textContent = group ? group.source + ": " + (own || group.help) : "";
    }
    // Hidden, not dimmed: only imagefolder and textfolder read a path (the server drops it
    // elsewhere); each offers its own folders (the select's groups).
    const isImages = dataset && dataset.value === options.imagefolder;
    const isTexts = dataset && dataset.value === options.textfolder;
    const isFolder = isImages || isTexts;
    if (folderField) folderField.hidden = !isFolder;
    if (folder) {
      for (const group of folder.querySelectorAll("optgroup")) {
        const shown = group.label === (isTexts ? "Text folders" : "Image folders");
        group.hidden = !shown;
        group.disabled = !shown;
      }
    }
    if (datasetExplain && dataset) {
      const row = options.datasets.find((d) => d.name === dataset.value);
      const folders = isTexts ? options.text_folders || [] : options.image_folders;
      const picked = isFolder && folder ? folders.find((f) => f.path === folder.value) : null;
      datasetExplain.textContent = picked ? picked.help : row ? row.help : "";
    }
    syncLanguage();
  }

  // A language model's size, window and sequence parallel: shown for one alone, with the
  // chosen size's line and window (#launch-options' `language`, core/language_fields.py).
  const languageFields = document.getElementById("language-fields");
  const modelSize = form.elements.namedItem("model_size");
  const seqLen = form.elements.namedItem("seq_len");
  const sequenceParallel = form.elements.namedItem("sequence_parallel");
  const sizeExplain = document.getElementById("model-size-explain");
  function syncLanguage() {
    const language = options && options.language;
    if (!language || !languageFields || !model) return;
    // A user's script reads none of them (its engine-only fields are hidden too).
    const spec = window.Trainyard ? Trainyard.facts.strategies[strategy.value] : null;
    const isLanguage = language.language_models.includes(model.value) && !(spec && spec.user_script);
    languageFields.hidden = !isLanguage;
    // Disabled too, as the strategy options are: a hidden field keeps whatever was typed, and
    // the browser will not send a form whose invalid field it cannot show (nothing happens).
    for (const input of languageFields.querySelectorAll("input, select")) {
      input.disabled = !isLanguage;
    }
    // byte-llama's sizes and sequence parallel; a plug-in's language model has its own.
    const sized = isLanguage && language.sized.includes(model.value);
    if (modelSize) {
      modelSize.disabled = !sized;
      modelSize.closest("#language-fields > div").hidden = !sized;
    }
    const size = language.sizes[(modelSize && modelSize.value) || language.size_default];
    if (sizeExplain) sizeExplain.textContent = size ? size.help : "";
    if (seqLen) seqLen.placeholder = sized && size ? "default (" + size.seq_len + ")" : "default (its own)";
    if (sequenceParallel) {
      // Read by tensor parallel alone: not sent elsewhere, where the server refuses "off".
      const read = sized && language.tensor_parallel.includes(strategy.value);
      const field = document.getElementById("field-sequence_parallel");
      if (field) field.hidden = !read;
      sequenceParallel.disabled = !read;
    }
  }
  for (const input of [model, dataset, folder, modelSize]) {
    if (input) input.addEventListener("change", syncCatalogue);
  }
  strategy.addEventListener("change", syncLanguage);
  syncCatalogue();

  // A user's own script reads none of the engine's model, data and training fields: they are
  // hidden for it (the server stores their defaults), and its own fields shown in their place.
  const engineOnly = form.querySelectorAll(".engine-only");
  const scriptOnly = form.querySelectorAll(".script-only");
  function syncScript() {
    if (!window.Trainyard) return;
    const spec = Trainyard.facts.strategies[strategy.value];
    const isScript = Boolean(spec && spec.user_script);
    for (const node of engineOnly) node.hidden = isScript;
    for (const node of scriptOnly) node.hidden = !isScript;
  }
  strategy.addEventListener("change", syncScript);
  syncScript();

  strategy.addEventListener("change", syncOptions);
  syncOptions();
  strategy.addEventListener("change", syncNodes);
  syncNodes();
  strategy.addEventListener("change", sync);
  sync();

  // The Processes and Batch size lines of the chosen strategy, and a pipeline's stage limit
  // for the chosen model, as the server wrote them (#form-help, core/form_texts.py).
  const helpNode = document.getElementById("form-help");
  const formHelp = helpNode ? JSON.parse(helpNode.textContent) : null;
  function syncFieldHelp() {
    if (!formHelp) return;
    const lines = formHelp.strategies[strategy.value];
    if (!lines) return;
    const processesHelp = document.getElementById("id_processes_helptext");
    const batchHelp = document.getElementById("id_batch_size_helptext");
    let processes = lines.processes;
    if (lines.stages && model) {
      processes += " " + (formHelp.stage_limits[model.value] || formHelp.stages_unknown);
    }
    if (processesHelp) processesHelp.textContent = processes;
    if (batchHelp) batchHelp.textContent = lines.batch_size;
  }
  strategy.addEventListener("change", syncFieldHelp);
  if (model) model.addEventListener("change", syncFieldHelp);
  syncFieldHelp();

  // A second click while the first POST is on its way would launch two runs.
  const button = form.querySelector('button[type="submit"]');
  const buttonText = button ? button.textContent : "";
  form.addEventListener("submit", function () {
    if (button) {
      button.disabled = true;
      button.textContent = "Starting…";
    }
  });
  // Coming back with the Back button restores the page as it was left: make it usable again.
  window.addEventListener("pageshow", function (event) {
    if (event.persisted && button) {
      button.disabled = false;
      button.textContent = buttonText;
    }
  });
})();
