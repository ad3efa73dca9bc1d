// Runs: every run folder under the checkpoint root, its status, and its TensorBoard scalars
// plotted per panel; ticked runs are overlaid.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const S = { runs: [], selected: new Set(), scalars: {} };

  // Panels: title -> [role, tag pattern]; the first tag of the pattern found in a run is drawn.
  const PANELS = [
    ["Reward", "explorer", [/^rollout\/reward_mean$/, /^rollout\/reward/, /reward/]],
    ["Loss", "trainer", [/^actor\/loss$/, /^actor\/pg_loss$/, /loss/]],
    ["Timing: explore step (s)", "explorer", [/^timing\/explore_step$/, /^timing\//]],
    ["Timing: train step (s)", "trainer", [/^timing\/step$/, /^timing\//]],
    ["Model-version lag", "explorer", [/lag|staleness/, /^rollout\/model_version$/]],
    // The log-prob guard's measure: how far the trainer's log-probs are from the engine's.
    ["Rollout vs trainer log-prob gap", "trainer", [/^rollout\/logprob_diff\/mean$/]],
  ];

  function firstTag(tags, patterns) {
    for (const pattern of patterns) {
      const tag = tags.find((t) => pattern.test(t));
      if (tag) return tag;
    }
    return null;
  }

  function series(role, patterns) {
    const out = [];
    for (const id of S.selected) {
      const scalars = (S.scalars[id] || {})[role] || {};
      const tag = firstTag(Object.keys(scalars).sort(), patterns);
      if (tag) out.push({ label: S.selected.size > 1 ? `${id} · ${tag}` : tag, points: scalars[tag] });
    }
    return out;
  }

  function evalSeries() {
    // eval/<taskset>/accuracy (the explorer's eval runs): one line per run and taskset.
    const out = [];
    for (const id of S.selected) {
      const scalars = (S.scalars[id] || {}).explorer || {};
      for (const tag of Object.keys(scalars).sort()) {
        const m = /^eval\/([^/]+)\/accuracy$/.exec(tag);
        if (m) out.push({ label: S.selected.size > 1 ? `${id} · ${m[1]}` : m[1], points: scalars[tag] });
      }
    }
    return out;
  }

  function drawCharts() {
    const box = $("runs-charts");
    box.replaceChildren();
    if (!S.selected.size) { box.append(Studio.el("p", { class: "muted", text: "Tick a run to plot it." })); return; }
    for (const [title, role, patterns] of PANELS) box.append(Studio.chart(title, series(role, patterns)));
    box.append(Studio.chart("Eval accuracy per taskset", evalSeries(), { empty: "no eval/<taskset>/accuracy scalars" }));
    const tag = $("runs-tag").value;
    if (tag) {
      const [role, name] = tag.split("::");
      box.prepend(Studio.chart(`${name} (${role})`, series(role, [new RegExp("^" + name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "$")])));
    }
    // every tag any selected run has, for the free choice
    const select = $("runs-tag"), current = select.value, tags = new Set();
    for (const id of S.selected) for (const [role, scalars] of Object.entries(S.scalars[id] || {})) for (const t of Object.keys(scalars)) tags.add(`${role}::${t}`);
    select.replaceChildren(Studio.el("option", { value: "", text: "(choose a tag)" }), [...tags].sort().map((t) => Studio.el("option", { value: t, text: t.replace("::", ": "), selected: t === current })));
  }

  async function loadScalars() {
    const missing = [...S.selected];
    if (!missing.length) return drawCharts();
    const query = missing.map((id) => "run=" + encodeURIComponent(id)).join("&");
    Object.assign(S.scalars, await Studio.api("GET", "api/runs/scalars?" + query));
    drawCharts();
  }

  async function refresh() {
    S.runs = await Studio.api("GET", "api/runs");
    const body = $("runs-table").querySelector("tbody");
    body.replaceChildren();
    if (!S.runs.length) body.append(Studio.el("tr", {}, Studio.el("td", { colspan: 8, class: "muted", text: `No runs under ${Studio.info.root} yet.` })));
    // Tick the newest run with data (a checkpoint or a logged metric), not an empty failed start.
    if (!S.selected.size && S.runs.length) S.selected.add((S.runs.find((r) => r.has_data) || S.runs[0]).id);
    for (const run of S.runs) {
      const box = Studio.el("input", { type: "checkbox", checked: S.selected.has(run.id), "data-run": run.id, onchange: (e) => { e.target.checked ? S.selected.add(run.id) : S.selected.delete(run.id); loadScalars(); } });
      const buffers = run.buffers.map((b) => Studio.el("a", { href: "#experiences?source=" + encodeURIComponent(b), text: b.split("/").pop() }));
      const configs = run.config_files.map((name) => Studio.el("a", { href: "#", "data-config": name, text: name, onclick: (e) => { e.preventDefault(); showConfig(run.id, name); } }));
      const note = run.has_data ? "" : " (no data)";
      body.append(Studio.el("tr", { "data-run": run.id, class: run.has_data ? "" : "no-data", title: run.has_data ? "" : "nothing logged and no checkpoint: a start that failed early?" },
        Studio.el("td", {}, box),
        Studio.el("td", { title: run.path, text: run.id + note }),
        Studio.el("td", {}, Studio.el("span", { class: "badge " + run.status, title: run.status_reason, text: run.status })),
        Studio.el("td", { text: Studio.fmtTime(run.updated) }),
        Studio.el("td", { text: run.roles.join(", ") }),
        Studio.el("td", { text: run.checkpoints }),
        Studio.el("td", {}, buffers.length ? buffers.flatMap((a, i) => (i ? [", ", a] : [a])) : Studio.el("span", { class: "muted buffer-note", title: run.buffer_note, text: run.buffer_note ? "none: " + run.buffer_note : "" })),
        Studio.el("td", {}, configs.length ? configs.flatMap((a, i) => (i ? [", ", a] : [a])) : Studio.el("span", { class: "muted", text: "not saved" }))));
    }
    for (const id of [...S.selected]) if (!S.runs.some((r) => r.id === id)) S.selected.delete(id);
    await loadScalars();
  }

  // The resolved config the launcher saved in the run folder, below the table.
  async function showConfig(id, name) {
    const data = await Studio.api("GET", "api/runs/config?run=" + encodeURIComponent(id));
    $("runs-config-title").textContent = `${id}/${name}`;
    $("runs-config-text").textContent = data.files[name] ?? "";
    $("runs-config").hidden = false;
  }

  Studio.pages.runs = {
    async show(params, first) {
      if (first) {
        $("runs-config-close").addEventListener("click", () => { $("runs-config").hidden = true; });
        $("runs-refresh").addEventListener("click", () => { S.scalars = {}; refresh(); });
        $("runs-tag").addEventListener("change", drawCharts);
      }
      const run = params.get("run");
      if (run) S.selected = new Set([run]);
      await refresh();
    },
    state: S,
  };
})();
