// The pipeline map's chips: a click selects that stage and brings its section to just under the
// sticky map (the map and the sidebar's answer stay in view); the selection survives the map's
// redraws (Gradio swaps its HTML), as one style rule that names the selected key.
(() => {
  let rule = null;
  function select(key) {
    if (!rule) { rule = document.createElement("style"); rule.id = "tt-map-selection"; document.head.appendChild(rule); }
    const k = CSS.escape(key);
    rule.textContent = `.tt-map-chip[data-key="${k}"] { outline: 3px solid #d9480f; outline-offset: 1px; }
      #tt-stage-${k} { box-shadow: inset 3px 0 0 #d9480f; padding-left: 8px !important; }`;
    document.body.dataset.ttStage = key;
  }
  function bringIntoView(key) {
    const section = document.getElementById(`tt-stage-${key}`);
    if (!section) return;
    const map = document.getElementById("tt-map");
    // the map covers the top of the page only where it is sticky (a wide screen)
    const sticky = map && getComputedStyle(map).position === "sticky" ? map.getBoundingClientRect().height : 0;
    const top = section.getBoundingClientRect().top + window.scrollY - sticky - 6;
    window.scrollTo({top: Math.max(0, top), behavior: "instant"});
  }
  document.addEventListener("click", (ev) => {
    const chip = ev.target.closest ? ev.target.closest("#tt-map .tt-map-chip[data-key]") : null;
    if (!chip) return;
    ev.preventDefault();  // the anchor's own jump would put the section's heading under the map
    select(chip.dataset.key);
    bringIntoView(chip.dataset.key);
  });
})();
