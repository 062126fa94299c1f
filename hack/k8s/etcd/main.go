// Command etcd is upstream etcd's server, built from the version k8s.io/kubernetes pins, so the
// local control plane needs nothing from the distribution.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
