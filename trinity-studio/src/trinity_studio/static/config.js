// Config builder: forms generated from /api/schema (the pydantic config models), component
// pickers from /api/components, live validation by /api/config/validate (what `trinity run`
// checks), and save / download / dry-run / launch.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const S = { schema: null, components: null, cfg: {}, mode: "beginner", timer: null, job: null, jobOffset: 0, poll: null, fileName: "config.yaml" };

  // -- paths: arrays of keys (strings) and list indexes (numbers) --------------------------
  const keyOf = (segs) => segs.reduce((out, s) => (typeof s === "number" ? `${out}[${s}]` : out ? `${out}.${s}` : s), "");
  function getPath(obj, segs) {
    for (const s of segs) {
      if (obj === null || obj === undefined) return undefined;
      obj = obj[s];
    }
    return obj;
  }
  function setPath(obj, segs, value) {
    let node = obj;
    segs.slice(0, -1).forEach((s, i) => {
      if (node[s] === null || typeof node[s] !== "object") node[s] = typeof segs[i + 1] === "number" ? [] : {};
      node = node[s];
    });
    const last = segs[segs.length - 1];
    if (value === undefined) {
      if (Array.isArray(node)) node[last] = {};
      else delete node[last];
    } else node[last] = value;
  }
  const split = (path) => path.split(".").map((p) => p);

  // -- values typed in a text box -> config values ---------------------------------------
  function parseValue(field, text) {
    if (text === "") return undefined;
    switch (field.type) {
      case "int":
        return /^[-+]?\d+$/.test(text.trim()) ? parseInt(text, 10) : text;
      case "float":
        return /^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text.trim()) ? parseFloat(text) : text;
      case "bool":
        return text === "true";
      case "mapping": case "list": case "any":
        try { return JSON.parse(text); } catch (e) { return field.type === "any" ? text : { __invalid__: text }; }
      default:
        return text;
    }
  }
  function showValue(field, value) {
    if (value === undefined || value === null) return "";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }
  const showDefault = (v) => (v === null || v === undefined ? "" : typeof v === "object" ? JSON.stringify(v) : String(v));

  // -- widgets ----------------------------------------------------------------------------
  function widget(field, segs) {
    const key = keyOf(segs);
    const value = getPath(S.cfg, segs);
    const onchange = (event) => {
      const parsed = parseValue(field, event.target.value);
      if (parsed && parsed.__invalid__ !== undefined) {
        setError(key, "expected JSON here, e.g. {\"key\": 1} or [1, 2]");
        return;
      }
      setPath(S.cfg, segs, parsed);
      changed();
      if (field.component) renderArgs(field, segs, row);
    };
    let input;
    if (field.type === "bool" || field.type === "choice") {
      const choices = field.type === "bool" ? ["true", "false"] : field.choices;
      input = Studio.el("select", { name: key, "data-key": key, onchange },
        Studio.el("option", { value: "", text: `(default: ${showDefault(field.default)})` }),
        choices.map((c) => Studio.el("option", { value: c, text: c, selected: String(value) === c })));
    } else if (field.type === "mapping" || field.type === "list" || (field.type === "any" && typeof value === "object")) {
      input = Studio.el("textarea", { name: key, "data-key": key, rows: 1, placeholder: showDefault(field.default) || "JSON", onchange });
      input.value = showValue(field, value);
    } else {
      const attrs = { type: "text", name: key, "data-key": key, placeholder: showDefault(field.default), onchange };
      if (field.component) attrs.list = "components-" + field.component;
      input = Studio.el("input", attrs);
      input.value = showValue(field, value);
    }
    const row = Studio.el("div", { class: "field", "data-field": key },
      Studio.el("label", { for: key, title: field.doc, text: field.label || field.name }),
      Studio.el("div", { class: "widget" }, input),
      Studio.el("div", { class: "doc", text: field.doc + (field.component ? ` (${(S.components[field.component] || []).length} installed: pick one or type a name)` : "") }),
      Studio.el("div", { class: "field-error", "data-error-for": key }));
    input.id = key;
    if (field.component) renderArgs(field, segs, row);
    return row;
  }

  // The picked component's default_args(), as fields of `<args_field>` in the same section.
  function renderArgs(field, segs, row) {
    const old = row.querySelector(":scope > .args");
    if (old) old.remove();
    const name = getPath(S.cfg, segs);
    const found = (S.components[field.component] || []).find((c) => c.name === name);
    if (!found || !field.args_field || !Object.keys(found.args).length) return;
    const argSegs = [...segs.slice(0, -1), ...field.args_field.split(".")];
    const box = Studio.el("div", { class: "args" }, Studio.el("div", { class: "muted", text: `${field.args_field} (defaults of ${name}${found.plugin ? ", from " + found.plugin : ""})` }));
    for (const [arg, def] of Object.entries(found.args)) {
      const type = typeof def === "number" ? "float" : typeof def === "boolean" ? "bool" : "any";
      box.append(widget({ name: arg, type, default: def, doc: "", nullable: true }, [...argSegs, arg]));
    }
    row.append(box);
  }

  function componentLists() {
    const holder = Studio.el("div");
    for (const [kind, rows] of Object.entries(S.components)) {
      if (kind === "errors") continue;
      holder.append(Studio.el("datalist", { id: "components-" + kind }, rows.map((r) => Studio.el("option", { value: r.name, text: r.plugin ? `${r.name} (${r.plugin})` : r.name }))));
    }
    return holder;
  }

  function renderModel(modelName, segs) {
    const model = S.schema.models[modelName];
    const out = [];
    for (const field of model.fields) {
      if (field.derived) continue;
      const fsegs = [...segs, field.name];
      if (field.type === "section") {
        const details = Studio.el("details", { class: "section", "data-section": keyOf(fsegs) },
          Studio.el("summary", {}, field.name, Studio.el("span", { class: "muted", text: field.doc })));
        let filled = false;
        details.addEventListener("toggle", () => {
          if (details.open && !filled) { filled = true; details.append(...renderModel(field.model, fsegs)); }
        });
        out.push(details);
      } else if (field.type === "sections") {
        out.push(renderList(field, fsegs));
      } else {
        out.push(widget(field, fsegs));
      }
    }
    return out;
  }

  function renderList(field, segs) {
    const key = keyOf(segs);
    const details = Studio.el("details", { class: "section", "data-section": key },
      Studio.el("summary", {}, `${field.name} [ ]`, Studio.el("span", { class: "muted", text: field.doc })));
    const body = Studio.el("div");
    const draw = () => {
      body.replaceChildren();
      const items = getPath(S.cfg, segs) || [];
      items.forEach((_, i) => {
        body.append(Studio.el("fieldset", { class: "item" },
          Studio.el("legend", {}, `${field.name}[${i}] `, Studio.el("button", { type: "button", onclick: () => { items.splice(i, 1); if (!items.length) setPath(S.cfg, segs, undefined); changed(); draw(); } }, "remove")),
          ...renderModel(field.model, [...segs, i])));
      });
      body.append(Studio.el("button", { type: "button", onclick: () => { const list = getPath(S.cfg, segs) || []; list.push({}); setPath(S.cfg, segs, list); draw(); } }, `add ${field.name} item`));
    };
    details.addEventListener("toggle", () => { if (details.open) draw(); });
    details.append(body);
    return details;
  }

  function render() {
    const form = $("cfg-form");
    form.replaceChildren(componentLists());
    if (S.mode === "beginner") {
      form.append(Studio.el("p", { class: "muted", text: "The keys most jobs set. Switch to Expert mode for every section." }));
      for (const field of S.schema.beginner) form.append(widget({ ...field, label: field.path }, split(field.path)));
    } else {
      form.append(...renderModel(S.schema.root, []));
    }
    showErrors(S.errors || []);
  }

  // -- validation -------------------------------------------------------------------------
  function changed() {
    updateYaml();
    clearTimeout(S.timer);
    S.timer = setTimeout(validate, 350);
  }
  async function updateYaml() {
    try { $("cfg-yaml").value = await Studio.api("POST", "api/config/yaml", { config: S.cfg }); } catch (e) { /* shown by validate */ }
  }
  async function validate() {
    const status = $("cfg-status");
    status.textContent = "checking…"; status.className = "status";
    try {
      const result = await Studio.api("POST", "api/config/validate", { config: S.cfg });
      S.errors = result.errors;
      showErrors(result.errors);
      status.textContent = result.ok ? "✓ valid" : `${result.errors.length} problem(s)`;
      status.className = "status " + (result.ok ? "ok" : "bad");
      return result;
    } catch (error) {
      status.textContent = error.message; status.className = "status bad";
      return null;
    }
  }
  function setError(key, message) {
    const slot = document.querySelector(`[data-error-for="${CSS.escape(key)}"]`);
    if (slot) { slot.textContent = message; slot.parentElement.classList.add("has-error"); }
    return !!slot;
  }
  function showErrors(errors) {
    for (const slot of document.querySelectorAll("[data-error-for]")) { slot.textContent = ""; slot.parentElement.classList.remove("has-error"); }
    const general = [];
    for (const e of errors) {
      // Beside the field when it is on the form, else at the top (with its key).
      if (!setError(e.key, e.message)) general.push(Studio.el("div", { class: "general-error" }, e.key ? `${e.key}: ` : "", e.message));
    }
    $("cfg-general-errors").replaceChildren(...general);
  }

  function load(config, name) {
    S.cfg = config || {};
    if (name) { S.fileName = name.split("/").pop(); if (!$("cfg-save-path").value && name.includes("/")) $("cfg-save-path").value = name; }
    render();
    changed();
  }
  const message = (text, bad) => { const m = $("cfg-message"); m.textContent = text; m.className = "message" + (bad ? " bad" : ""); };

  // -- jobs -------------------------------------------------------------------------------
  async function pollJob() {
    if (!S.job) return;
    try {
      const out = await Studio.api("GET", `api/jobs/${S.job}/output?offset=${S.jobOffset}`);
      if (out.text) { const pre = $("cfg-output"); pre.textContent += out.text; pre.scrollTop = pre.scrollHeight; }
      S.jobOffset = out.offset;
      $("job-status").textContent = `job ${out.id} (pid ${out.pid}): ${out.status}` + (out.exit_code !== null ? `, exit code ${out.exit_code}` : "");
      $("job-status").className = "status " + (out.status === "failed" ? "bad" : out.status === "finished" ? "ok" : "");
      if (out.status === "running") { S.poll = setTimeout(pollJob, 700); return; }
      $("cfg-stop").disabled = true; $("cfg-launch").disabled = false;
    } catch (error) { message(error.message, true); }
  }

  function bind() {
    $("cfg-mode").addEventListener("change", (e) => { S.mode = e.target.value; render(); });
    $("cfg-new").addEventListener("click", () => load({}, "config.yaml"));
    $("cfg-file").addEventListener("change", async (e) => {
      const file = e.target.files[0];
      if (!file) return;
      try { load((await Studio.api("POST", "api/config/parse", { yaml: await file.text() })).config, file.name); message(`loaded ${file.name}`); }
      catch (error) { message(error.message, true); }
      e.target.value = "";
    });
    $("cfg-load").addEventListener("click", async () => {
      try { const out = await Studio.api("POST", "api/config/load", { path: $("cfg-load-path").value }); load(out.config, out.path); message(`loaded ${out.path}`); }
      catch (error) { message(error.message, true); }
    });
    $("cfg-apply-yaml").addEventListener("click", async () => {
      try { load((await Studio.api("POST", "api/config/parse", { yaml: $("cfg-yaml").value })).config); message("applied the YAML"); }
      catch (error) { message(error.message, true); }
    });
    $("cfg-save").addEventListener("click", async () => {
      try { const out = await Studio.api("POST", "api/config/save", { path: $("cfg-save-path").value, config: S.cfg }); message(`saved ${out.path}`); }
      catch (error) { message(error.message, true); }
    });
    $("cfg-download").addEventListener("click", async () => {
      const text = await Studio.api("POST", "api/config/yaml", { config: S.cfg });
      const link = Studio.el("a", { href: URL.createObjectURL(new Blob([text], { type: "application/x-yaml" })), download: S.fileName });
      document.body.append(link); link.click(); link.remove();
    });
    $("cfg-dry-run").addEventListener("click", async () => {
      const result = await validate();
      if (!result) return;
      $("cfg-output").textContent = result.ok ? result.yaml : result.errors.map((e) => `${e.key ? e.key + ": " : ""}${e.message}`).join("\n");
      message(result.ok ? "dry run: the config is valid; the resolved config is below" : "dry run: the config is invalid", !result.ok);
    });
    $("cfg-launch").addEventListener("click", async () => {
      try {
        const job = await Studio.api("POST", "api/jobs", { config: S.cfg, path: $("cfg-save-path").value });
        S.job = job.id; S.jobOffset = 0; $("cfg-output").textContent = "";
        $("cfg-stop").disabled = false; $("cfg-launch").disabled = true;
        message(`launched trinity run --config ${job.config_file}`);
        pollJob();
      } catch (error) {
        if (error.data && error.data.errors) showErrors(error.data.errors);
        message(error.message, true);
      }
    });
    $("cfg-stop").addEventListener("click", async () => {
      if (S.job) { await Studio.api("POST", `api/jobs/${S.job}/stop`); message("sent SIGINT (Ctrl-C) to the job"); }
    });
  }

  Studio.pages.config = {
    async show(params, first) {
      if (!first) return;
      bind();
      [S.schema, S.components] = await Promise.all([Studio.api("GET", "api/schema"), Studio.api("GET", "api/components")]);
      if (S.components.errors && S.components.errors.length) message("plugins that failed to load: " + S.components.errors.join("; "), true);
      const file = params.get("file");
      if (file) { $("cfg-load-path").value = file; $("cfg-load").click(); } else load({});
    },
    state: S,
  };
})();
