document.getElementById("app").textContent = "Served for " + location.pathname;
