use std::process::Command;

use super::*;

#[test]
fn macs_are_formatted_and_parsed() {
    let mac = [0x0a, 0xbc, 0x00, 0x12, 0xef, 0xff];
    assert_eq!(format_mac(mac), "0a:bc:00:12:ef:ff");
    assert_eq!(parse_mac("0a:bc:00:12:ef:ff"), Some(mac));
    assert_eq!(parse_mac("0A:BC:00:12:EF:FF"), Some(mac));
    for bad in [
        "",
        "0a:bc:00:12:ef",
        "0a:bc:00:12:ef:ff:00",
        "0a:bc:00:12:ef:f",
        "0a:bc:00:12:ef:fff",
        "0a-bc-00-12-ef-ff",
        "0a:bc:00:12:ef:+f",
        "0a:bc:00:12:ef:gg",
        "0a:bc:00:12:ef:ff:",
    ] {
        assert_eq!(parse_mac(bad), None, "{bad:?}");
    }
}

fn subnet(s: &str) -> Subnet {
    s.parse().expect("a test subnet")
}

fn peer(net: &str, endpoint: [u8; 4], last: u8) -> Peer {
    Peer {
        subnet: subnet(net),
        subnet6: None,
        endpoint: Ipv4Addr::from(endpoint),
        mac: [0x02, 0, 0, 0, 0, last],
    }
}

#[test]
fn bad_peers_and_devices_are_refused_before_any_netlink() {
    let a = peer("10.244.2.0/24", [192, 0, 2, 2], 2);
    let mut same_subnet = peer("10.244.2.0/24", [192, 0, 2, 3], 3);
    let same_mac = peer("10.244.3.0/24", [192, 0, 2, 3], 2);
    let mut multicast = peer("10.244.3.0/24", [192, 0, 2, 3], 3);
    multicast.mac[0] = 0x01;
    let mut zero = multicast;
    zero.mac = [0; 6];
    for peers in [
        vec![a, same_subnet],
        vec![a, same_mac],
        vec![multicast],
        vec![zero],
    ] {
        let e = check_peers(&peers).expect_err("refused");
        assert_eq!(e.kind(), Kind::InvalidArgument, "{e}");
    }
    same_subnet.subnet = subnet("10.244.3.0/24");
    check_peers(&[a, same_subnet]).expect("distinct peers");

    let dev = |vni, port, name: &str| Device {
        name: name.to_string(),
        vni,
        port,
        local: Ipv4Addr::new(192, 0, 2, 1),
        mtu: Some(1450),
    };
    for d in [
        dev(1 << 24, 8472, "nodelet.1"),
        dev(1, 0, "nodelet.1"),
        dev(1, 8472, "a/b"),
    ] {
        let e = ensure(&d, subnet("10.244.1.0/24"), None).expect_err("refused");
        assert_eq!(e.kind(), Kind::InvalidArgument, "{e}");
    }
}

/// Runs `f` on a thread of its own in a new network namespace (with `lo` up and a veth
/// pair `uplink`/`uplink-peer`, `uplink` holding 192.0.2.1/24 with MTU 1500), so that
/// nothing touches the node's network. Processes spawned from `f` are in that namespace
/// too. Skipped (loudly) when not root.
fn in_new_netns(test: &str, f: impl FnOnce() + Send + 'static) {
    if !nix::unistd::Uid::effective().is_root() {
        crate::skip("needs root", test);
        return;
    }
    let thread = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
        for args in [
            "link set lo up",
            "link add uplink mtu 1500 type veth peer name uplink-peer",
            "addr add 192.0.2.1/24 dev uplink",
            "link set uplink up",
            "link set uplink-peer up",
        ] {
            ip(args);
        }
        f();
    });
    if let Err(panic) = thread.join() {
        std::panic::resume_unwind(panic);
    }
}

/// Runs `program args` (split at blanks), expects success, returns its stdout.
fn run(program: &str, args: &str) -> String {
    let out = Command::new(program)
        .args(args.split_whitespace())
        .output()
        .unwrap_or_else(|e| panic!("running {program} {args}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(args: &str) -> String {
    run("ip", args)
}

fn device(vni: u32) -> Device {
    Device {
        name: "nodelet.1".to_string(),
        vni,
        port: 8472,
        local: Ipv4Addr::new(192, 0, 2, 1),
        mtu: None,
    }
}

fn link(name: &str) -> Option<Link> {
    let mut nl = Netlink::open().expect("netlink");
    let index = nl.link_index(name).expect("link index")?;
    nl.link(index).expect("link")
}

/// The IPv4 addresses on `name`, as `ip` shows them ("a.b.c.d/len").
fn addresses(name: &str) -> Vec<String> {
    ip(&format!("-4 -o addr show dev {name}"))
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next().map(str::to_string)
        })
        .collect()
}

#[test]
fn ensure_makes_checks_and_remakes_the_device() {
    in_new_netns("ensure_makes_checks_and_remakes_the_device", || {
        let own = subnet("10.244.1.0/24");
        let mac = ensure(&device(42), own, None).expect("ensure");
        let l = link("nodelet.1").expect("the device");
        assert_eq!(l.kind.as_deref(), Some("vxlan"));
        assert!(l.up);
        assert_eq!(l.mac, Some(mac));
        assert_eq!(l.mtu, Some(1450), "the uplink's 1500 minus 50");
        let v = l.vxlan.clone().expect("vxlan settings");
        assert_eq!(v.vni, Some(42));
        assert_eq!(v.port, Some(8472));
        assert_eq!(v.local, Some(Ipv4Addr::new(192, 0, 2, 1)));
        assert!(!v.learning);
        // And as iproute2 sees it.
        let shown = ip("-d link show nodelet.1");
        eprintln!("{shown}");
        for want in [
            "vxlan id 42 ",
            "local 192.0.2.1 ",
            "dstport 8472 ",
            "nolearning",
            "mtu 1450 ",
            ",UP",
            &format!("link/ether {} ", format_mac(mac)),
        ] {
            assert!(shown.contains(want), "{want:?} not in {shown}");
        }
        assert_eq!(addresses("nodelet.1"), ["10.244.1.0/32"]);

        // Again: nothing changes.
        assert_eq!(ensure(&device(42), own, None).expect("ensure again"), mac);
        assert_eq!(link("nodelet.1"), Some(l.clone()));

        // An explicit MTU is set in place; the device stays.
        let mut with_mtu = device(42);
        with_mtu.mtu = Some(1400);
        assert_eq!(ensure(&with_mtu, own, None).expect("ensure, MTU 1400"), mac);
        let l2 = link("nodelet.1").expect("the device");
        assert_eq!((l2.index, l2.mtu), (l.index, Some(1400)));

        // Another subnet: its address replaces the old one, and a stray one goes too.
        ip("addr add 10.9.9.9/32 dev nodelet.1");
        assert_eq!(
            ensure(&with_mtu, subnet("10.244.7.0/24"), None).expect("ensure, other subnet"),
            mac
        );
        assert_eq!(addresses("nodelet.1"), ["10.244.7.0/32"]);

        // Another VNI, then another port: the device is made again.
        ensure(&device(43), own, None).expect("ensure, VNI 43");
        let l3 = link("nodelet.1").expect("the device");
        assert_ne!(l3.index, l.index, "made again");
        assert_eq!(l3.vxlan.as_ref().and_then(|v| v.vni), Some(43));
        assert_eq!(l3.mtu, Some(1450));
        assert_eq!(addresses("nodelet.1"), ["10.244.1.0/32"]);
        let mut other_port = device(43);
        other_port.port = 4789;
        let mac4 = ensure(&other_port, own, None).expect("ensure, port 4789");
        let l4 = link("nodelet.1").expect("the device");
        assert_ne!(l4.index, l3.index, "made again");
        assert_eq!(l4.vxlan.as_ref().and_then(|v| v.port), Some(4789));
        assert_eq!(l4.mac, Some(mac4));
        assert!(ip("-d link show nodelet.1").contains("dstport 4789 "));

        // Learning turned on by hand: made again with it off.
        ip("link set nodelet.1 type vxlan learning");
        let learning = link("nodelet.1").and_then(|l| l.vxlan).map(|v| v.learning);
        assert_eq!(learning, Some(true), "learning turned on");
        ensure(&other_port, own, None).expect("ensure, learning was on");
        let l5 = link("nodelet.1").expect("the device");
        assert_ne!(l5.index, l4.index, "made again");
        assert_eq!(l5.vxlan.map(|v| v.learning), Some(false));
        assert!(ip("-d link show nodelet.1").contains("nolearning"));

        // A source address no link holds: no MTU to derive, said so.
        let mut nowhere = device(43);
        nowhere.local = Ipv4Addr::new(198, 51, 100, 1);
        let e = ensure(&nowhere, own, None).expect_err("no link holds the address");
        assert_eq!(e.kind(), Kind::FailedPrecondition, "{e}");

        // A link of that name that is not a VXLAN device is not ours to delete.
        let mut bridge = device(42);
        bridge.name = "br-x".to_string();
        ip("link add br-x type bridge");
        let e = ensure(&bridge, own, None).expect_err("not a vxlan device");
        assert_eq!(e.kind(), Kind::FailedPrecondition, "{e}");
        assert!(e.to_string().contains("br-x"), "{e}");
        let e = remove("br-x").expect_err("not a vxlan device");
        assert_eq!(e.kind(), Kind::FailedPrecondition, "{e}");
        assert!(link("br-x").is_some());

        remove("nodelet.1").expect("remove");
        assert_eq!(link("nodelet.1"), None);
        remove("nodelet.1").expect("remove again");
    });
}

fn fdb() -> String {
    run("bridge", "fdb show dev nodelet.1")
}
fn neighbours() -> String {
    ip("neigh show dev nodelet.1")
}
fn proto_routes() -> String {
    ip("route show proto 110")
}

fn has_peer(p: &Peer) -> [bool; 3] {
    let (mac, net, len) = (format_mac(p.mac), p.subnet.network, p.subnet.prefix_len);
    [
        fdb().contains(&format!("{mac} dst {} self permanent", p.endpoint)),
        neighbours().contains(&format!("{net} lladdr {mac} PERMANENT")),
        proto_routes().contains(&format!("{net}/{len} via {net} dev nodelet.1 onlink")),
    ]
}

#[test]
fn sync_installs_changes_and_removes_entries() {
    in_new_netns("sync_installs_changes_and_removes_entries", || {
        let a = peer("10.244.2.0/24", [192, 0, 2, 2], 2);
        let b = peer("10.244.3.0/24", [192, 0, 2, 3], 3);
        assert_eq!(sync("nodelet.1", &[]).expect("no device, no peers"), 0);
        let e = sync("nodelet.1", &[a]).expect_err("no device");
        assert_eq!(e.kind(), Kind::FailedPrecondition, "{e}");
        ensure(&device(1), subnet("10.244.1.0/24"), None).expect("ensure");

        assert_eq!(sync("nodelet.1", &[a, b]).expect("sync a, b"), 6);
        eprintln!(
            "fdb:\n{}neighbours:\n{}routes:\n{}",
            fdb(),
            neighbours(),
            proto_routes()
        );
        assert_eq!(has_peer(&a), [true; 3]);
        assert_eq!(has_peer(&b), [true; 3]);
        assert_eq!(sync("nodelet.1", &[b, a]).expect("sync a, b again"), 0);

        // b moves to another address: its forwarding entry is replaced.
        let mut b2 = b;
        b2.endpoint = Ipv4Addr::new(192, 0, 2, 33);
        assert_eq!(sync("nodelet.1", &[a, b2]).expect("b moved"), 1);
        assert_eq!(has_peer(&b2), [true; 3], "{}", fdb());
        assert!(!fdb().contains("dst 192.0.2.3 "), "{}", fdb());
        // b gets another MAC: forwarding entries (one in, one out) and neighbour entry.
        let mut b3 = b2;
        b3.mac[5] = 0x33;
        assert_eq!(sync("nodelet.1", &[a, b3]).expect("b's new MAC"), 3);
        assert_eq!(has_peer(&b3), [true; 3]);
        assert!(!fdb().contains(&format_mac(b2.mac)), "{}", fdb());

        // b goes: its three entries go, a's stay.
        assert_eq!(sync("nodelet.1", &[a]).expect("sync a"), 3);
        assert_eq!(has_peer(&a), [true; 3]);
        assert_eq!(has_peer(&b3), [false; 3]);
        assert!(!neighbours().contains("10.244.3.0"), "{}", neighbours());

        // None: all go.
        assert_eq!(sync("nodelet.1", &[]).expect("sync none"), 3);
        assert_eq!(has_peer(&a), [false; 3]);
        assert_eq!(proto_routes(), "");
        assert!(!fdb().contains(" dst "), "{}", fdb());

        // A wrong entry put there by hand is corrected.
        ip("neigh replace 10.244.2.0 lladdr 02:00:00:00:00:99 dev nodelet.1 nud permanent");
        assert_eq!(sync("nodelet.1", &[a]).expect("sync a"), 3);
        assert_eq!(has_peer(&a), [true; 3]);

        // Removing the device takes its entries with it.
        remove("nodelet.1").expect("remove");
        assert_eq!(proto_routes(), "");
        assert_eq!(sync("nodelet.1", &[]).expect("no device, no peers"), 0);
    });
}

#[test]
fn host_gw_and_vxlan_routes_leave_each_other_alone() {
    in_new_netns("host_gw_and_vxlan_routes_leave_each_other_alone", || {
        use super::super::routes;
        ensure(&device(1), subnet("10.244.1.0/24"), None).expect("ensure");
        let a = peer("10.244.2.0/24", [192, 0, 2, 2], 2);
        assert_eq!(sync("nodelet.1", &[a]).expect("sync a"), 3);
        let vxlan_route = "10.244.2.0/24 via 10.244.2.0 dev nodelet.1 onlink";
        let host_gw_route = "10.244.5.0/24 via 192.0.2.5 dev uplink";

        // host-gw: adds its own route, and does not count or touch the VXLAN route.
        let host_gw = [(
            subnet("10.244.5.0/24"),
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 5)),
        )];
        assert_eq!(routes::sync(&host_gw).expect("host-gw sync"), 1);
        assert_eq!(routes::sync(&host_gw).expect("host-gw sync again"), 0);
        let shown = proto_routes();
        eprintln!("{shown}");
        assert!(shown.contains(vxlan_route), "{shown}");
        assert!(shown.contains(host_gw_route), "{shown}");

        // VXLAN with the same peers: nothing to do, the host-gw route is not its.
        assert_eq!(sync("nodelet.1", &[a]).expect("sync a again"), 0);
        // VXLAN with none: its route goes, the host-gw route stays.
        assert_eq!(sync("nodelet.1", &[]).expect("sync none"), 3);
        let shown = proto_routes();
        assert!(!shown.contains(vxlan_route), "{shown}");
        assert!(shown.contains(host_gw_route), "{shown}");

        // host-gw with none: its route goes, the VXLAN route stays.
        assert_eq!(sync("nodelet.1", &[a]).expect("sync a"), 3);
        assert_eq!(routes::sync(&[]).expect("host-gw sync none"), 1);
        let shown = proto_routes();
        assert!(shown.contains(vxlan_route), "{shown}");
        assert!(!shown.contains(host_gw_route), "{shown}");
        assert_eq!(routes::sync(&[]).expect("host-gw sync none again"), 0);
        assert_eq!(has_peer(&a), [true; 3]);
    });
}

#[test]
fn ipv6_subnets_go_by_host_gw_routes_and_through_the_ipv4_tunnel() {
    in_new_netns(
        "ipv6_subnets_go_by_host_gw_routes_and_through_the_ipv4_tunnel",
        || {
            use super::super::routes;
            ip("-6 addr add 2001:db8::1/64 dev uplink nodad");
            let v6 = [
                (subnet("10.244.5.0/24"), "192.0.2.5".parse().expect("ip")),
                (subnet("fd00:5::/64"), "2001:db8::5".parse().expect("ip")),
            ];
            assert_eq!(routes::sync(&v6).expect("dual sync"), 2);
            assert_eq!(routes::sync(&v6).expect("dual sync again"), 0);
            let shown = ip("-6 route show proto 110");
            assert!(
                shown.contains("fd00:5::/64 via 2001:db8::5 dev uplink"),
                "{shown}"
            );
            // The IPv6 route goes with its node; the IPv4 one stays.
            assert_eq!(routes::sync(&v6[..1]).expect("v4 only"), 1);
            assert_eq!(ip("-6 route show proto 110").trim(), "");
            assert!(proto_routes().contains("10.244.5.0/24 via 192.0.2.5"));

            // The overlay: an IPv4 tunnel carrying the IPv6 subnets too: the device holds the
            // node's IPv6 subnet's network address, and each peer's IPv6 subnet gets a neighbour
            // entry and an onlink route.
            let e = ensure(&device(1), subnet("fd00:1::/64"), None).expect_err("refused");
            assert!(e.to_string().contains("IPv4 pod subnets only"), "{e}");
            let own6 = subnet("fd00:1::/64");
            ensure(&device(1), subnet("10.244.1.0/24"), Some(own6)).expect("ensure");
            let addrs = ip("-6 addr show dev nodelet.1");
            assert!(addrs.contains("inet6 fd00:1::/128"), "{addrs}");
            let mut p = peer("10.244.2.0/24", [192, 0, 2, 2], 2);
            p.subnet6 = Some(subnet("fd00:2::/64"));
            assert_eq!(sync("nodelet.1", &[p]).expect("sync"), 5);
            assert_eq!(sync("nodelet.1", &[p]).expect("sync again"), 0);
            let neigh = ip("-6 neigh show dev nodelet.1");
            assert!(
                neigh.contains("fd00:2:: lladdr 02:00:00:00:00:02 PERMANENT"),
                "{neigh}"
            );
            let routes6 = ip("-6 route show proto 110");
            assert!(
                routes6.contains("fd00:2::/64 via fd00:2:: dev nodelet.1"),
                "{routes6}"
            );
            // The peer's IPv6 subnet goes (the node is IPv4 only now): its entries go.
            p.subnet6 = None;
            assert_eq!(sync("nodelet.1", &[p]).expect("sync v4"), 2);
            assert_eq!(ip("-6 route show proto 110").trim(), "");
            // The node's own IPv6 subnet goes: its address leaves the device.
            ensure(&device(1), subnet("10.244.1.0/24"), None).expect("ensure v4");
            let addrs = ip("-6 addr show dev nodelet.1");
            assert!(!addrs.contains("fd00:1::"), "{addrs}");
            let mut bad = peer("10.244.3.0/24", [192, 0, 2, 3], 3);
            bad.subnet6 = Some(subnet("10.244.4.0/24"));
            assert!(check_peers(&[bad]).is_err());
        },
    );
}
