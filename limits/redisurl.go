package limits

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/quiet"
)

// ParseRedisURL turns REDIS_URL into client options: redis:// and
// rediss:// (one server, or several hosts for Cluster), and
// redis+sentinel://[:password@]host1:26379,host2:26379/master[/db].
func ParseRedisURL(raw string) (*redis.UniversalOptions, error) {
	return parseRedisURL(raw)
}

// NewRedisClient builds the UniversalClient for REDIS_URL, tuned for
// decisions bounded by a short timeout: the context's deadline governs
// every socket operation, and a failed call is not retried (a retry would
// only spend the same deadline; the next request tries again).
func NewRedisClient(raw string) (redis.UniversalClient, error) {
	o, err := parseRedisURL(raw)
	if err != nil {
		return nil, err
	}
	o.ContextTimeoutEnabled = true
	o.MaxRetries = -1
	o.DialTimeout = time.Second
	if o.Dialer == nil && o.TLSConfig == nil {
		// Plain TCP reads and writes as raw system calls (internal/quiet
		// says why); TLS and unix sockets keep go-redis's own dialing.
		// The keep-alive is go-redis's: probing after 30 s idle, the
		// peer dead after 3 probes 5 s apart.
		d := &net.Dialer{Timeout: o.DialTimeout, KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}}
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return quiet.Conn(c), nil
		}
	}
	// RESP2 unless the URL asks for 3: RESP3's push notifications (which
	// the decisions never use) cost a check of the socket on every call,
	// ~13 % of the client's CPU per decision.
	if o.Protocol == 0 {
		o.Protocol = 2
	}
	// One dial attempt: a dead node refuses at once, and go-redis's five
	// attempts 100 ms apart would hold a cluster's slot-map reload on it.
	o.DialerRetries = 1
	if o.PoolSize == 0 {
		// go-redis's default (10 per CPU) makes concurrent decisions queue
		// for a connection: parking and waking cost more than the call
		// (tests/bench/redis.sh).
		o.PoolSize = max(64, 10*runtime.GOMAXPROCS(0))
	}
	// Keep the connections Warm opened: opening one within a decision's
	// 50 ms is what made the first burst after a start time out.
	if o.MinIdleConns == 0 {
		o.MinIdleConns = o.PoolSize
	}
	if o.MasterName == "" && (len(o.Addrs) > 1 || o.IsClusterMode) {
		co := o.Cluster()
		// Failures reload the slot map at once (Redis.failed); this bounds
		// how stale it gets without them.
		co.ClusterStateReloadInterval = 5 * time.Second
		// Follow one MOVED (a resharded slot), but do not retry
		// CLUSTERDOWN with back-off until the deadline: the cluster is
		// degraded for as long as a failover takes, and the decision
		// should fail fast so FAIL_OPEN applies.
		co.MaxRedirects = 1
		return redis.NewClusterClient(co), nil
	}
	return redis.NewUniversalClient(o), nil
}

// parseRedisURL reads REDIS_URL into UniversalOptions. One host is a
// single server; several comma-separated hosts are a Cluster; the
// redis+sentinel scheme names Sentinels and, in the path, the master.
func parseRedisURL(raw string) (*redis.UniversalOptions, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, errors.New("not a URL (redis://host:6379)")
	}
	// url.Parse takes one host: split the host list out first.
	authority, path, _ := strings.Cut(rest, "/")
	userinfo, hostList := "", authority
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		userinfo, hostList = authority[:i+1], authority[i+1:]
	}
	hosts := strings.Split(hostList, ",")
	u, err := url.Parse(scheme + "://" + userinfo + hosts[0] + "/" + path)
	if err != nil {
		return nil, errors.New("not a URL")
	}
	if hosts[0] == "" && scheme != "unix" {
		return nil, errors.New("no host")
	}
	switch scheme {
	case "redis", "rediss", "unix":
		if len(hosts) == 1 || scheme == "unix" {
			o, err := redis.ParseURL(raw)
			if err != nil {
				return nil, err
			}
			uo := &redis.UniversalOptions{
				Addrs: []string{o.Addr}, DB: o.DB, Username: o.Username, Password: o.Password,
				TLSConfig: o.TLSConfig, Protocol: o.Protocol, PoolSize: o.PoolSize,
			}
			if o.Network == "unix" {
				addr := o.Addr
				uo.Dialer = func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", addr)
				}
			}
			return uo, nil
		}
		o := &redis.UniversalOptions{Addrs: hosts, IsClusterMode: true}
		o.Username, o.Password = userPass(u)
		if scheme == "rediss" {
			first, err := redis.ParseURL("rediss://" + hosts[0])
			if err != nil {
				return nil, err
			}
			o.TLSConfig = first.TLSConfig
		}
		return o, nil
	case "redis+sentinel":
		parts := strings.Split(strings.Trim(u.Path, "/"), "/")
		if parts[0] == "" {
			return nil, errors.New("redis+sentinel URL needs the master name as its path: redis+sentinel://host:26379/mymaster")
		}
		o := &redis.UniversalOptions{Addrs: hosts, MasterName: parts[0]}
		o.Username, o.Password = userPass(u)
		if len(parts) > 1 {
			db, err := strconv.Atoi(parts[1])
			if err != nil {
				return nil, fmt.Errorf("bad database number %q", parts[1])
			}
			o.DB = db
		}
		return o, nil
	}
	return nil, fmt.Errorf("scheme %q is not redis, rediss, redis+sentinel or unix", scheme)
}

func userPass(u *url.URL) (string, string) {
	if u.User == nil {
		return "", ""
	}
	p, _ := u.User.Password()
	return u.User.Username(), p
}
