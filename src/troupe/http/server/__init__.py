"""The lean HTTP/1.1 server: Trio sockets, llhttp (httptools), no framework.

`HttpServer` accepts and drains; `Connection` reads requests in order (keep-alive,
pipelining, limits, timeouts); `Exchange` is one request and the means to answer it.
It knows nothing of the router: a `Handler` (`troupe.http.front.Front`) serves each
request; `troupe.http.serve` puts the two together.
"""
