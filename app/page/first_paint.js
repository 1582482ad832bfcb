// A browser whose page will be Chinese (the choice the server makes at the load: ?lang=, the
// tt_lang cookie, the browser's languages: visualizers/i18n/negotiate.py) hides the page until
// the load has put it in Chinese: the page is built in English, and a Chinese reader would
// otherwise see it first. Shown again when the switch says 中文, or after 15 s whatever happens.
(function () {
  function norm(tag) {
    tag = (tag || "").trim().replace("_", "-").toLowerCase();
    return tag.startsWith("zh") ? "zh" : tag.split("-")[0] === "en" ? "en" : null;
  }
  var query = new URLSearchParams(location.search).get("lang");
  var cookie = (document.cookie.match(/(?:^|;\s*)tt_lang=([^;]*)/) || [])[1];
  var langs = [query, cookie].concat(navigator.languages || [navigator.language]);
  var lang = langs.map(norm).find(function (l) { return l; }) || "en";
  if (lang !== "zh") return;
  var root = document.documentElement;
  root.lang = "zh-CN";
  root.classList.add("tt-lang-wait");
  var style = document.createElement("style");
  style.textContent = "html.tt-lang-wait body { visibility: hidden !important; }";
  document.head.appendChild(style);
  var started = Date.now();
  var timer = setInterval(function () {
    var zh = document.querySelector('#tt-lang input[value="中文"]');
    if ((zh && zh.checked) || Date.now() - started > 15000) {
      clearInterval(timer);
      requestAnimationFrame(function () { root.classList.remove("tt-lang-wait"); });
    }
  }, 30);
})();
