module github.com/embedfleet/embedfleet/hack/node/testserver

go 1.26.0
