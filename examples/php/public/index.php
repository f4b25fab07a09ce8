<?php
// A front controller: every pretty URL lands here (see examples/php.conf).
header('Content-Type: text/plain');
echo "Hello from PHP behind sluice\n";
echo "You asked for: ", $_SERVER['REQUEST_URI'], "\n";
echo "Script: ", $_SERVER['SCRIPT_NAME'], "\n";
