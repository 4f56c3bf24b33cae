"""Looking at runs from here: the status table (status.py), log following across dropped connections
(logs.py), and the board, a live loopback web page (board.py, board_http.py, board.html). May import: ssh,
transfer, errors, and enlace's contract, errors, units and curves."""
