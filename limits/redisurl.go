package limits

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

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
