# Loads a Vagrantfile with a stand-in for Vagrant's configuration API and prints, as JSON,
# every setting and call it makes (provider blocks included), so tests can check what
# `vagrant validate` cannot see without the vagrant-libvirt plugin installed.
require "json"

class Recorder
  attr_reader :calls

  def initialize
    @calls = []
    @children = {}
  end

  def method_missing(name, *args, **kwargs, &block)
    if name.to_s.end_with?("=")
      @calls << { "set" => name.to_s.chomp("="), "value" => args.first }
      return args.first
    end
    if block
      child = Recorder.new
      @calls << { "call" => name.to_s, "args" => args, "kwargs" => kwargs, "block" => child }
      block.call(child)
      return child
    end
    if args.empty? && kwargs.empty?
      return @children[name] ||= Recorder.new.tap do |c|
        @calls << { "attr" => name.to_s, "block" => c }
      end
    end
    @calls << { "call" => name.to_s, "args" => args, "kwargs" => kwargs }
    nil
  end

  def respond_to_missing?(*) = true

  def to_json(*a) = @calls.to_json(*a)
end

module Vagrant
  @root = Recorder.new
  class << self
    attr_reader :root

    def configure(version)
      raise "unsupported config version #{version}" unless version.to_s == "2"
      yield @root
    end

    def has_plugin?(*) = false
  end
end

load ARGV.fetch(0)
puts JSON.generate(Vagrant.root)
