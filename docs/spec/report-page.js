
(function () {
  var ids = ["f-family", "f-variant", "f-arm", "f-outcome"];
  var tasks = document.querySelectorAll("section.task");
  function value(id) { return document.getElementById(id).value; }
  function apply() {
    var family = value("f-family"), variant = value("f-variant");
    var arm = value("f-arm"), outcome = value("f-outcome"), shown = 0;
    for (var i = 0; i < tasks.length; i++) {
      var task = tasks[i], rows = task.querySelectorAll("tr[data-arm]"), any = false;
      for (var j = 0; j < rows.length; j++) {
        var row = rows[j];
        var visible = (!arm || row.getAttribute("data-arm") === arm) &&
                      (!outcome || row.getAttribute("data-outcome") === outcome);
        row.hidden = !visible;
        any = any || visible;
      }
      task.hidden = !(any && (!family || task.getAttribute("data-family") === family) &&
                      (!variant || task.getAttribute("data-variant") === variant));
      if (!task.hidden) { shown++; }
    }
    document.getElementById("shown").textContent =
      shown + " of " + tasks.length + " tasks shown";
  }
  for (var k = 0; k < ids.length; k++) {
    document.getElementById(ids[k]).addEventListener("change", apply);
  }
  apply();
})();
