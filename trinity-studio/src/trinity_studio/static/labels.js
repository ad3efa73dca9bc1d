// Labels: people compare two answers to a prompt and pick the better one (or skip the pair),
// for the human_preference_annotation_mapper operator. Each choice is stored with the
// labeller's name and the time; a pair someone else labelled meanwhile is not labelled twice.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const NAME_KEY = "trinity-studio-labeller";
  const S = { store: "", pair: null, busy: false };
  const message = (text, bad) => { const m = $("lab-message"); m.textContent = text || ""; m.className = "message" + (bad ? " bad" : ""); };

  const optionText = (p) => `${p.project} — ${p.counts.pending} to go`;

  function showCounts(info) {
    const c = info.counts;
    $("lab-progress").textContent = `${c.labelled} labelled, ${c.skipped} skipped, ${c.pending} to go (of ${c.pairs})`;
    const option = [...$("lab-store").options].find((o) => o.value === info.store);
    if (option) option.textContent = optionText(info);
  }

  async function loadProjects(wanted) {
    const list = await Studio.api("GET", "api/labels/projects");
    const select = $("lab-store");
    select.replaceChildren(...list.map((p) => Studio.el("option", { value: p.store, title: p.store, text: optionText(p) })));
    if (!list.length) { message("No label store under this root: a job with human_preference_annotation_mapper creates one (<job dir>/annotation/<project>.db)."); return; }
    if (wanted && list.some((p) => p.store === wanted)) select.value = wanted;
    await openStore(select.value);
  }

  async function openStore(store, after) {
    S.store = store;
    $("lab-export").href = "api/labels/export?" + new URLSearchParams({ store });
    try {
      const next = await Studio.api("GET", "api/labels/next?" + new URLSearchParams({ store, after: after ?? -1 }));
      showCounts(next);
      $("lab-answer1-name").textContent = next.answer1_key;
      $("lab-answer2-name").textContent = next.answer2_key;
      S.pair = next.pair;
      const card = $("lab-card");
      card.hidden = !S.pair;
      if (!S.pair) { message("Every pair of this project is decided. The job waiting for them goes on by itself."); return; }
      card.dataset.pair = S.pair.pair_id;
      $("lab-prompt").textContent = S.pair.prompt;
      $("lab-answer1").textContent = S.pair.answer1;
      $("lab-answer2").textContent = S.pair.answer2;
      message("");
    } catch (error) { message(error.message, true); }
  }

  async function decide(choice) {
    if (!S.pair || S.busy) return;
    const name = $("lab-name").value.trim();
    if (!name) { message("Type your name first: it is recorded with each label.", true); $("lab-name").focus(); return; }
    localStorage.setItem(NAME_KEY, name);
    S.busy = true;
    const pair = S.pair;
    try {
      await Studio.api("POST", "api/labels", { store: S.store, pair_id: pair.pair_id, choice, labelled_by: name });
      await openStore(S.store, pair.position);
    } catch (error) {
      // Labelled by someone else meanwhile (409): theirs stands; go on to the next pair.
      if (error.data && error.data.label) { await openStore(S.store, pair.position); message(error.message); }
      else message(error.message, true);
    } finally { S.busy = false; }
  }

  Studio.pages.labels = {
    async show(params, first) {
      if (first) {
        $("lab-name").value = localStorage.getItem(NAME_KEY) || "";
        $("lab-store").addEventListener("change", (e) => openStore(e.target.value));
        $("lab-refresh").addEventListener("click", () => loadProjects(S.store));
        $("lab-pick1").addEventListener("click", () => decide("answer1"));
        $("lab-pick2").addEventListener("click", () => decide("answer2"));
        $("lab-skip").addEventListener("click", () => decide("skip"));
        // Keys 1, 2 and s, outside the name field.
        document.addEventListener("keydown", (e) => {
          if (Studio.current !== "labels" || e.target.tagName === "INPUT" || e.ctrlKey || e.metaKey || e.altKey) return;
          const choice = { "1": "answer1", "2": "answer2", s: "skip" }[e.key];
          if (choice) { e.preventDefault(); decide(choice); }
        });
      }
      try { await loadProjects(params.get("store") || S.store); } catch (error) { message(error.message, true); }
    },
    state: S,
  };
})();
