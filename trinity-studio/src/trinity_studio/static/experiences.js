// Experiences: page through an SQL buffer or a JSON-lines file, filter by reward and step,
// open one experience to see its tokens coloured by logprob, advantage or action mask.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const S = { offset: 0, limit: 50, total: 0, colour: "logprob", detail: null };

  function query(extra) {
    const q = new URLSearchParams({ source: $("exp-source").value.trim() });
    if (!$("exp-table").hidden && $("exp-table").value) q.set("table", $("exp-table").value);
    for (const [id, key] of [["exp-min", "min_reward"], ["exp-max", "max_reward"], ["exp-step", "step"]]) {
      const value = $(id).value.trim();
      if (value) q.set(key, value);
    }
    for (const [k, v] of Object.entries(extra || {})) q.set(k, v);
    return q.toString();
  }
  const message = (text, bad) => { const m = $("exp-message"); m.textContent = text || ""; m.className = "message" + (bad ? " bad" : ""); };

  async function loadPage() {
    if (!$("exp-source").value.trim()) { message("Give a buffer: a .jsonl file (trinity debug --output-file), an SQLite .db file or an SQLAlchemy URL."); return; }
    try {
      const page = await Studio.api("GET", "api/experiences?" + query({ offset: S.offset, limit: S.limit }));
      S.total = page.total;
      const tables = $("exp-table");
      if (page.kind === "sql" && page.table) { tables.hidden = false; if (!tables.options.length) tables.append(Studio.el("option", { value: page.table, text: page.table })); }
      const body = $("exp-table-rows").querySelector("tbody");
      body.replaceChildren(...page.rows.map((r) => Studio.el("tr", { "data-id": r.id, onclick: (e) => openItem(r.id, e.currentTarget) },
        Studio.el("td", { text: r.id }),
        Studio.el("td", { text: Studio.fmtNum(r.reward) }),
        Studio.el("td", { text: r.model_version ?? "" }),
        Studio.el("td", { text: r.explorer_step ?? "" }),
        Studio.el("td", { text: r.consumed_step !== null && r.consumed_step !== undefined ? `step ${r.consumed_step}` : r.consumed ? "yes" : "" }),
        Studio.el("td", { class: "text", title: r.prompt || "", text: r.prompt || "" }),
        Studio.el("td", { class: "text", title: r.response || "", text: r.response || "" }))));
      $("exp-range").textContent = page.total ? `${S.offset + 1}–${S.offset + page.rows.length} of ${page.total}` : "no experiences match";
      $("exp-prev").disabled = S.offset === 0;
      $("exp-next").disabled = S.offset + S.limit >= page.total;
      $("exp-export").href = "api/experiences/export?" + query();
      message("");
    } catch (error) { message(error.message, true); }
  }

  // -- token view -------------------------------------------------------------------------
  function colourFor(mode, value) {
    if (value === null || value === undefined) return "transparent";
    if (mode === "mask") return value ? "rgba(46,158,91,.28)" : "rgba(120,120,120,.18)";
    if (mode === "logprob") {
      const p = Math.exp(Math.max(-20, value)); // probability: 1 -> green, 0 -> red
      return `hsla(${Math.round(120 * p)}, 75%, 50%, .35)`;
    }
    const a = Math.max(-1, Math.min(1, value)); // advantage: blue positive, red negative
    return a >= 0 ? `rgba(47,111,222,${0.12 + 0.5 * a})` : `rgba(229,84,58,${0.12 - 0.5 * a})`;
  }

  // Values of a response-length array (or a whole-sequence one) at token index i.
  function at(array, i, promptLength, total) {
    if (!array) return null;
    if (array.length === total) return array[i];
    const j = i - promptLength;
    return j >= 0 && j < array.length ? array[j] : null;
  }

  function drawTokens() {
    const d = S.detail, box = $("exp-tokens");
    if (!d || !box) return;
    const tokens = d.tokens || [], total = tokens.length, pl = d.prompt_length || 0;
    const key = { logprob: "logprobs", advantage: "advantages", mask: "action_mask" }[S.colour];
    box.replaceChildren(...tokens.map((t, i) => {
      const value = at(d[key], i, pl, total);
      const text = d.pieces ? d.pieces[i] : String(t) + " ";
      const span = Studio.el("span", { class: "tok" + (i < pl ? " prompt" : ""), "data-index": i, "data-value": value === null ? "" : String(value),
        title: `#${i} token ${t}` + ["logprobs", "advantages", "action_mask"].map((k) => { const v = at(d[k], i, pl, total); return v === null ? "" : `\n${k}: ${Studio.fmtNum(v)}`; }).join("") , text });
      if (i >= pl) span.style.background = colourFor(S.colour, value);
      return span;
    }));
  }

  async function openItem(id, row) {
    for (const tr of document.querySelectorAll("#exp-table-rows tr.selected")) tr.classList.remove("selected");
    if (row) row.classList.add("selected");
    const detail = $("exp-detail");
    detail.replaceChildren(Studio.el("p", { class: "muted", text: `loading experience ${id}…` }));
    try {
      // Empty: the studio decodes with the tokenizer of the run the buffer belongs to (its saved
      // config's model), when it finds one; "-" shows ids.
      const tokenizer = $("exp-tokenizer") ? $("exp-tokenizer").value.trim() : S.tokenizer || "";
      const d = await Studio.api("GET", "api/experiences/item?" + query({ id, ...(tokenizer ? { tokenizer } : {}) }));
      S.tokenizer = d.tokenizer || tokenizer;
      S.detail = d;
      const decoded = d.tokenizer_error ? d.tokenizer_error : d.pieces ? `tokens decoded with ${d.tokenizer}` : "tokens as ids: give a tokenizer folder (the model's) to see text";
      const modes = [["logprob", "logprob"], ["advantage", "advantage"], ["mask", "action mask"]];
      detail.replaceChildren(
        Studio.el("h3", { text: `Experience ${d.id}` }),
        Studio.el("dl", { class: "kv" },
          [["reward", Studio.fmtNum(d.reward)], ["model version", d.model_version], ["explorer step", d.explorer_step ?? ""], ["consumed by step", d.consumed_step ?? ""], ["eid", JSON.stringify(d.eid)], ["tokens", `${(d.tokens || []).length} (prompt ${d.prompt_length})`], ["metrics", JSON.stringify(d.metrics)]]
            .flatMap(([k, v]) => [Studio.el("dt", { text: k }), Studio.el("dd", { text: v })])),
        Studio.el("h4", { text: "Prompt" }), Studio.el("div", { class: "textblock", text: d.prompt_text || "" }),
        Studio.el("h4", { text: "Response" }), Studio.el("div", { class: "textblock", text: d.response_text || "" }),
        Studio.el("h4", {}, "Tokens ", Studio.el("select", { id: "exp-colour", onchange: (e) => { S.colour = e.target.value; drawTokens(); } },
          modes.map(([v, t]) => Studio.el("option", { value: v, text: "colour by " + t, selected: v === S.colour })))),
        Studio.el("div", { class: "row" }, Studio.el("input", { id: "exp-tokenizer", placeholder: "tokenizer folder (shows text instead of ids)", size: 34, value: S.tokenizer }),
          Studio.el("button", { onclick: () => openItem(id, row) }, "Decode")),
        Studio.el("p", { id: "exp-decoded", class: d.tokenizer_error ? "message bad" : "muted", text: decoded }),
        Studio.el("div", { id: "exp-tokens", class: "tokens" }));
      drawTokens();
    } catch (error) { detail.replaceChildren(Studio.el("p", { class: "message bad", text: error.message })); }
  }

  Studio.pages.experiences = {
    async show(params, first) {
      if (first) {
        $("exp-open").addEventListener("click", () => { S.offset = 0; loadPage(); });
        $("exp-prev").addEventListener("click", () => { S.offset = Math.max(0, S.offset - S.limit); loadPage(); });
        $("exp-next").addEventListener("click", () => { S.offset += S.limit; loadPage(); });
        $("exp-source").addEventListener("change", () => { $("exp-table").replaceChildren(); $("exp-table").hidden = true; S.tokenizer = ""; if ($("exp-tokenizer")) $("exp-tokenizer").value = ""; });
        Studio.api("GET", "api/experiences/sources").then((list) => $("exp-sources").replaceChildren(...list.map((s) => Studio.el("option", { value: s }))));
      }
      const source = params.get("source") || (first && Studio.info.experience_file) || "";
      if (source) {
        if (source !== $("exp-source").value) { S.tokenizer = ""; if ($("exp-tokenizer")) $("exp-tokenizer").value = ""; }
        $("exp-source").value = source; S.offset = 0; await loadPage();
      }
      else if (first) loadPage();
    },
    state: S,
  };
})();
