// pgevents console. Written for the console, no build step, no
// dependency: it refreshes the elements marked data-live by fetching the
// page again every data-refresh milliseconds (not while the tab is hidden
// or a field has the focus), and asks before a button marked data-confirm
// submits. The pages work without it.
(function () {
  'use strict';
  var period = parseInt(document.body.getAttribute('data-refresh'), 10) || 2000;

  function editing() {
    var a = document.activeElement;
    return a && /^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName);
  }

  function refresh() {
    if (document.hidden || editing() || !document.querySelector('[data-live][id]')) {
      return;
    }
    fetch(window.location.href, { credentials: 'same-origin', headers: { 'Accept': 'text/html' } })
      .then(function (res) { return res.ok ? res.text() : null; })
      .then(function (html) {
        if (html === null) {
          return;
        }
        // DOMParser runs no script: the page is the console's own,
        // escaped, HTML.
        var doc = new DOMParser().parseFromString(html, 'text/html');
        document.querySelectorAll('[data-live][id]').forEach(function (el) {
          var fresh = doc.getElementById(el.id);
          if (fresh && !el.querySelector('input:checked')) {
            el.replaceWith(document.importNode(fresh, true));
          }
        });
        document.body.setAttribute('data-refreshed', String(Date.now()));
      })
      .catch(function () { /* the next refresh tries again */ });
  }
  window.setInterval(refresh, period);

  document.addEventListener('submit', function (ev) {
    var b = ev.submitter || null;
    var msg = (b && b.getAttribute('data-confirm')) || ev.target.getAttribute('data-confirm');
    if (msg && !window.confirm(msg)) {
      ev.preventDefault();
    }
  });
})();
