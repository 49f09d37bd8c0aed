package main

import "time"

// hubStopWait bounds how long the hub may take to stop after SIGTERM (it
// drains its xDS streams over --shutdown-grace, 10 s by default).
const hubStopWait = time.Minute
